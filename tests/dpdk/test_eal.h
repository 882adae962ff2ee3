// SPDX-License-Identifier: Apache-2.0
#pragma once
/// EAL for the DPDK test suites: started once per test process (ctest runs each test in its own),
/// quietly, with spindle's defaults.

#include <string>

#include "net/dpdk/eal.h"

namespace spindle::testing_support {

/// Starts EAL unless it runs already; returns "" when it runs, else why it could not start (for
/// the skip message: the tests skip only when DPDK cannot initialise at all).
inline std::string startTestEal() {
    using namespace spindle::dpdk;
    static std::string failure;
    if (ealRunning()) { return ""; }
    if (!failure.empty()) { return failure; }
    EalOptions o;
    o.logLevel = "*:error";
    if (auto r = startEal(o, &failure); !r && failure.empty()) { failure = r.error().message(); }
    return ealRunning() ? "" : failure;
}

}  // namespace spindle::testing_support
