// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Where carriers go: a policy that turns a topology and a carrier count into the PU (OS index)
/// each carrier stands for. On a synthetic or XML topology the PUs may not exist on this host;
/// the runtime then runs carriers unbound but keeps these positions for every decision that
/// depends on them (steal order, node-local memory).
///
/// Policies (each walks its order and wraps around when `count` exceeds it):
/// - kPerCore (default): Topology::pus() order, i.e. the first PU of every core, then the
///   second PUs, ...; natural count: coreCount().
/// - kPerPu: the same order; natural count: every PU.
/// - kCompact: topology order: every PU of a core, then the next core of the node, then
///   the next node; natural count: every PU.
/// - kScatter: round robin over the NUMA nodes that hold PUs, each node in pus() order;
///   natural count: coreCount().
/// - kExplicit: the given OS indexes, in the given order; natural count: their number.
///
/// Thread-safety: free functions on const data; safe anywhere.

#include <cstdint>
#include <string>
#include <vector>

#include "base/result.h"
#include "numa/topology.h"

namespace spindle::numa {

enum class Placement : uint8_t { kPerCore, kPerPu, kCompact, kScatter, kExplicit };

/// "per-core", "per-pu", "compact", "scatter", "list"; "unknown" otherwise.
const char* toString(Placement p) noexcept;

/// A policy and, for kExplicit, its PUs.
struct PlacementSpec {
    Placement policy = Placement::kPerCore;
    std::vector<unsigned> pus;  // kExplicit only: OS indexes
};

/// Parses "per-core", "per-pu", "compact", "scatter" or "list:<os>,<os>,..." (e.g. "list:0,2,4").
/// Errors: EINVAL for anything else, an empty or malformed list, or an index above 2^20 (logged).
[[nodiscard]] Result<PlacementSpec> parsePlacement(const std::string& text);

/// The PU (OS index) for each of `count` carriers under `policy`; count 0 means the policy's
/// natural count. `explicitPus` is read for kExplicit only.
/// Errors: EINVAL (logged) for kExplicit with an empty list, a duplicate, an OS index not
/// among topology.pus(), or count greater than the list; EINVAL for a policy out of range or
/// an empty topology (moved-from); ENOMEM.
[[nodiscard]] Result<std::vector<unsigned>> placeCarriers(const Topology& topology, Placement policy,
                                                          unsigned count,
                                                          const std::vector<unsigned>& explicitPus = {});

/// Where the SQPOLL kernel thread of each carrier's ring goes (IORING_SETUP_SQ_AFF), given the PU (OS
/// index) each carrier stands for (placeCarriers' answer): in carrier order, the nearest PU that
/// stands for no carrier and has no SQ thread yet (the SMT sibling first, then by Topology::distance,
/// then the first in OS order after the carrier's PU, cyclic). A spinning carrier, or a busy SQ thread,
/// and an SQ thread on one CPU take turns by the scheduler's time slice, milliseconds per hop; so where
/// no such PU is left the answer is -1, which leaves the thread to the kernel. One entry per carrier.
/// Throws std::bad_alloc.
[[nodiscard]] std::vector<int> placeSqThreads(const Topology& topology, const std::vector<unsigned>& carrierPus);

}  // namespace spindle::numa
