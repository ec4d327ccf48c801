#include <cstdio>
int ecokv_metric(int, char **) { std::fprintf(stderr, "ecokv metric: not built yet\n"); return 1; }
