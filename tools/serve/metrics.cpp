#include "metrics.h"

#include <cstdio>

namespace ecokv::serve {

std::string prometheus_text(const std::vector<metric> & table) {
    std::string out;
    for (const metric & m : table) {
        const std::string name = std::string("ecokv_") + m.name;
        char              value[64];
        std::snprintf(value, sizeof value, "%.6g", m.value);
        out += "# HELP " + name + " " + m.help + "\n# TYPE " + name + " " + m.kind + "\n" + name + " " + value + "\n";
    }
    return out;
}

}  // namespace ecokv::serve
