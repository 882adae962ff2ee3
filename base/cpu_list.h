// SPDX-License-Identifier: Apache-2.0
#pragma once
/// CPU lists as Linux writes them (/proc's Cpus_allowed_list, sysfs' cpulist files): "0-3,8,10-11".
///
/// parseCpuList reads one (the daemons' --worker-cpus), formatCpuList writes one (the runtime's
/// messages, spindle-topo's report), cpusIn lists the CPUs of a cpu_set_t. OS CPU indexes throughout.
///
/// Errors: parseCpuList answers std::nullopt for text that is not such a list (see there); all three
/// throw std::bad_alloc when out of memory, and nothing else.
/// Thread-safety: pure functions.

#include <sched.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace spindle {

/// The CPUs `text` spells, in ascending order without repeats ("3,1-2" gives 1, 2, 3); std::nullopt
/// for anything else: an empty list or item, a range that runs backwards, a CPU at or past
/// CPU_SETSIZE, a sign or a space, and taskset's stride form ("0-10:2").
[[nodiscard]] std::optional<std::vector<unsigned>> parseCpuList(std::string_view text);

/// `cpus` (any order; repeats count once) with runs of consecutive CPUs as ranges: {8, 1, 2, 3} gives
/// "1-3,8"; "" for none.
[[nodiscard]] std::string formatCpuList(std::vector<unsigned> cpus);

/// The CPUs in `set`, ascending.
[[nodiscard]] std::vector<unsigned> cpusIn(const cpu_set_t& set);

}  // namespace spindle
