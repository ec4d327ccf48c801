#include "metrics.h"

#include <cstdio>

namespace ecokv::serve {

std::string prometheus_text(const std::vector<metric> & table) {
    std::string out, last;
    for (const metric & m : table) {
        const std::string name = std::string("ecokv_") + m.name;
        char              value[64];
        std::snprintf(value, sizeof value, "%.6g", m.value);
        if (name != last) {
            out += "# HELP " + name + " " + m.help + "\n# TYPE " + name + " " + m.kind + "\n";
            last = name;
        }
        out += name + (m.labels.empty() ? "" : "{" + m.labels + "}") + " " + value + "\n";
    }
    return out;
}

}  // namespace ecokv::serve
