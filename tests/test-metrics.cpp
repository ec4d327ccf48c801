#include <gtest/gtest.h>
#include "ecokv/metrics.h"
TEST(x, y) {}
