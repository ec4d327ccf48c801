// ecokv serve: /metrics as a table of {name, kind, help, value}, written in Prometheus's text format.
#pragma once

#include <string>
#include <vector>

namespace ecokv::serve {

struct metric {
    const char * name;  // after the "ecokv_" prefix
    const char * kind;  // "counter" or "gauge"
    const char * help;
    double       value;
    std::string  labels = {};  // e.g. fault="corrupted": rows of one name after each other share its HELP and TYPE
};

// # HELP and # TYPE of each name, then the sample of each row, in table order.
std::string prometheus_text(const std::vector<metric> & table);

}  // namespace ecokv::serve
