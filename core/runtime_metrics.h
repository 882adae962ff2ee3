// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The runtime's counters as Prometheus metric families (base/metrics_text.h): one family per counter of
/// CarrierStats, each with a sample per carrier labelled `carrier="<index>"`, plus the runtime-wide
/// gauges. docs/RUNTIME.md and README.md ("Metrics") list the names.
///
/// Reading them stops nothing: Runtime::stats() loads each carrier's owner-written counters (relaxed
/// atomics), so a page is a racy snapshot, each number exact as of some moment during the read and
/// never torn; carriers neither pause nor take a lock for it.
/// Errors: none of their own; a writer that refused an earlier call ignores these (Writer::take()
/// reports that error).
/// Thread-safety: any thread or fiber, concurrently with the carriers.

#include <span>

#include "base/metrics_text.h"
#include "core/runtime.h"

namespace spindle::metrics {

/// Writes the families of `stats` (from Runtime::stats()): spindle_carrier_*, one sample per entry.
void writeCarrierStats(Writer& out, std::span<const CarrierStats> stats);

/// Writes spindle_runtime_info, spindle_fibers_live and the families of writeCarrierStats for
/// `runtime.stats()`.
void writeRuntime(Writer& out, const Runtime& runtime);

}  // namespace spindle::metrics
