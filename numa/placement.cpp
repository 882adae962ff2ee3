// SPDX-License-Identifier: Apache-2.0
#include "numa/placement.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <new>
#include <set>
#include <tuple>
#include <utility>

#include "base/log.h"

namespace spindle::numa {
namespace {

constexpr unsigned kMaxListedPu = 1u << 20;  // as numa/topology.cpp: no real machine comes close

// `order` repeated until `count` entries are taken.
std::vector<unsigned> cycle(const std::vector<unsigned>& order, unsigned count) {
    std::vector<unsigned> out;
    out.reserve(count);
    for (unsigned i = 0; i < count; ++i) { out.push_back(order[i % order.size()]); }
    return out;
}

}  // namespace

const char* toString(Placement p) noexcept {
    switch (p) {
        case Placement::kPerCore: return "per-core";
        case Placement::kPerPu: return "per-pu";
        case Placement::kCompact: return "compact";
        case Placement::kScatter: return "scatter";
        case Placement::kExplicit: return "list";
    }
    return "unknown";
}

Result<PlacementSpec> parsePlacement(const std::string& text) {
    try {
        PlacementSpec spec;
        if (text == "per-core") { return spec; }
        if (text == "per-pu") { spec.policy = Placement::kPerPu; return spec; }
        if (text == "compact") { spec.policy = Placement::kCompact; return spec; }
        if (text == "scatter") { spec.policy = Placement::kScatter; return spec; }
        if (text.rfind("list:", 0) == 0) {
            spec.policy = Placement::kExplicit;
            std::string_view rest = std::string_view(text).substr(5);
            while (!rest.empty()) {
                size_t comma = rest.find(',');
                std::string_view item = rest.substr(0, comma);
                unsigned value = 0;
                auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
                if (item.empty() || ec != std::errc() || end != item.data() + item.size() || value > kMaxListedPu) {
                    log::warn("numa: placement \"{}\": \"{}\" is not a PU OS index", text, item);
                    return Error{EINVAL};
                }
                spec.pus.push_back(value);
                if (comma == std::string_view::npos) { break; }
                rest = rest.substr(comma + 1);
                if (rest.empty()) {
                    log::warn("numa: placement \"{}\" ends in a comma", text);
                    return Error{EINVAL};
                }
            }
            if (spec.pus.empty()) {
                log::warn("numa: placement \"{}\" lists no PU", text);
                return Error{EINVAL};
            }
            return spec;
        }
        log::warn("numa: placement is per-core, per-pu, compact, scatter or list:<os>,..., not \"{}\"", text);
        return Error{EINVAL};
    } catch (const std::bad_alloc&) {
        return Error{ENOMEM};
    }
}

Result<std::vector<unsigned>> placeCarriers(const Topology& topology, Placement policy, unsigned count,
                                            const std::vector<unsigned>& explicitPus) {
    const std::vector<Pu>& pus = topology.pus();
    if (pus.empty()) {
        log::warn("numa: placeCarriers on an empty topology");
        return Error{EINVAL};
    }
    try {
        std::vector<unsigned> order;
        unsigned natural = 0;
        switch (policy) {
            case Placement::kPerCore:
            case Placement::kPerPu:
                for (const Pu& pu : pus) { order.push_back(pu.os); }
                natural = policy == Placement::kPerCore ? topology.coreCount() : static_cast<unsigned>(pus.size());
                break;
            case Placement::kCompact: {
                // pus() keeps cores in logical (depth-first) order within each rank, so sorting by
                // (node, core) and keeping that order among siblings gives topology order.
                std::vector<Pu> sorted(pus.begin(), pus.end());
                std::stable_sort(sorted.begin(), sorted.end(), [](const Pu& a, const Pu& b) {
                    return std::tie(a.package, a.node, a.core) < std::tie(b.package, b.node, b.core);
                });
                for (const Pu& pu : sorted) { order.push_back(pu.os); }
                natural = static_cast<unsigned>(pus.size());
                break;
            }
            case Placement::kScatter: {
                std::vector<std::vector<unsigned>> byNode(topology.nodeCount());
                for (const Pu& pu : pus) {
                    if (pu.node >= byNode.size()) { byNode.resize(pu.node + 1); }
                    byNode[pu.node].push_back(pu.os);
                }
                for (size_t round = 0; order.size() < pus.size(); ++round) {
                    for (const auto& node : byNode) {
                        if (round < node.size()) { order.push_back(node[round]); }
                    }
                }
                natural = topology.coreCount();
                break;
            }
            case Placement::kExplicit: {
                if (explicitPus.empty()) {
                    log::warn("numa: explicit placement with no PU");
                    return Error{EINVAL};
                }
                std::set<unsigned> seen;
                for (unsigned os : explicitPus) {
                    if (!seen.insert(os).second) {
                        log::warn("numa: explicit placement lists PU P#{} twice", os);
                        return Error{EINVAL};
                    }
                    if (std::none_of(pus.begin(), pus.end(), [os](const Pu& p) { return p.os == os; })) {
                        log::warn("numa: explicit placement: PU P#{} is not one of the {} PUs of the topology ({})",
                                  os, pus.size(), topology.describe());
                        return Error{EINVAL};
                    }
                }
                if (count > explicitPus.size()) {
                    log::warn("numa: explicit placement lists {} PUs for {} carriers", explicitPus.size(), count);
                    return Error{EINVAL};
                }
                order = explicitPus;
                natural = static_cast<unsigned>(explicitPus.size());
                break;
            }
            default:
                log::warn("numa: placement policy {} is out of range", static_cast<unsigned>(policy));
                return Error{EINVAL};
        }
        return cycle(order, count == 0 ? std::max(natural, 1u) : count);
    } catch (const std::bad_alloc&) {
        return Error{ENOMEM};
    }
}

std::vector<int> placeSqThreads(const Topology& topology, const std::vector<unsigned>& carrierPus) {
    const std::vector<Pu>& pus = topology.pus();
    std::vector<const Pu*> spare;
    for (const Pu& p : pus) {
        if (std::find(carrierPus.begin(), carrierPus.end(), p.os) == carrierPus.end()) { spare.push_back(&p); }
    }
    std::vector<int> out;
    out.reserve(carrierPus.size());
    for (const unsigned self : carrierPus) {
        size_t best = spare.size();
        const auto rank = [&](size_t i) {
            const unsigned os = spare[i]->os;
            const unsigned after = os > self ? os - self : os + (1u << 31) - self;  // cyclic OS order after self
            return std::pair(topology.distance(self, os), after);
        };
        for (size_t i = 0; i < spare.size(); ++i) {
            if (spare[i] != nullptr && (best == spare.size() || rank(i) < rank(best))) { best = i; }
        }
        if (best == spare.size()) {
            out.push_back(-1);
        } else {
            out.push_back(static_cast<int>(spare[best]->os));
            spare[best] = nullptr;  // one SQ thread per PU
        }
    }
    return out;
}

}  // namespace spindle::numa
