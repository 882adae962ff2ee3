// SPDX-License-Identifier: Apache-2.0
#include "net/dpdk/eal.h"

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_lcore.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "base/log.h"

namespace spindle::dpdk {
namespace {

enum class EalState { kNever, kRunning, kFailed, kStopped };

std::mutex gLock;
EalState gState = EalState::kNever;  // guarded by gLock
int gFailure = 0;                    // the errno of the failed start
std::string gRuntimeDir;             // EAL's runtime directory, removed by stopEal()
std::atomic<bool> gRunning{false};
std::atomic<int> gRegistered{0};     // threads registered through registerThread()

thread_local int tlsUsers = 0;  // registerThread() calls on this thread not yet undone

// "0-3,6": the calling thread's CPUs as an EAL cpuset.
std::string currentCpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof(set), &set) != 0) { return "0"; }
    std::string out;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (!CPU_ISSET(cpu, &set)) { continue; }
        int last = cpu;
        while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set)) { ++last; }
        if (!out.empty()) { out += ','; }
        out += std::to_string(cpu);
        if (last > cpu) { out += '-' + std::to_string(last); }
        cpu = last;
    }
    return out.empty() ? "0" : out;
}

std::string joined(const std::vector<std::string>& args) {
    std::string s;
    for (const auto& a : args) {
        if (!s.empty()) { s += ' '; }
        s += a;
    }
    return s;
}

// At exit, without rte_eal_cleanup (ports may still be open): EAL's runtime directory is empty
// under --no-shconf, and a directory per process that ran would pile up in /var/run/dpdk.
void removeRuntimeDir() noexcept {
    std::lock_guard<std::mutex> g(gLock);
    if (gRuntimeDir.empty()) { return; }
    std::error_code ec;
    std::filesystem::remove(gRuntimeDir, ec);  // only if empty: never anything EAL still uses
    gRuntimeDir.clear();
}

void report(std::string* why, std::string text) {
    log::error("dpdk: {}", text);
    if (why != nullptr) { *why = std::move(text); }
}

}  // namespace

Result<std::vector<std::string>> ealArguments(const EalOptions& o) noexcept {
    try {
        std::vector<std::string> a{"spindle"};
        a.push_back("--lcores=0@(" + currentCpus() + ")");
        if (!o.hugepages) {
            a.push_back("--no-huge");
            a.push_back("-m");
            a.push_back(std::to_string(o.memoryMb));
        }
        if (o.pciDevices.empty()) { a.push_back("--no-pci"); }
        for (const auto& pci : o.pciDevices) {
            if (pci.empty()) { return Error{EINVAL}; }
            a.push_back("-a");
            a.push_back(pci);
        }
        for (const auto& vdev : o.vdevs) {
            if (vdev.empty()) { return Error{EINVAL}; }
            a.push_back("--vdev=" + vdev);
        }
        a.push_back("--file-prefix=" + (o.filePrefix.empty() ? "spindle-" + std::to_string(::getpid()) : o.filePrefix));
        a.push_back("--no-shconf");
        a.push_back("--no-telemetry");
        a.push_back("--iova-mode=va");
        if (!o.logLevel.empty()) { a.push_back("--log-level=" + o.logLevel); }
        for (const auto& extra : o.extraArgs) { a.push_back(extra); }
        return a;
    } catch (const std::bad_alloc&) {
        return Error{ENOMEM};
    }
}

Result<void> startEal(const EalOptions& options, std::string* why) noexcept {
    std::lock_guard<std::mutex> g(gLock);
    if (gState != EalState::kNever) {
        const char* state = gState == EalState::kRunning ? "is already running"
                            : gState == EalState::kFailed ? "failed to start earlier in this process"
                                                          : "was stopped earlier in this process";
        report(why, fmt::format("EAL {}; it can be set up once per process", state));
        return Error{EALREADY};
    }
    auto args = ealArguments(options);
    if (!args) {
        report(why, "EAL options: an empty PCI address or vdev string");
        return Error{args.errorCode()};
    }
    std::vector<char*> argv;
    try {
        for (auto& s : *args) { argv.push_back(s.data()); }
        argv.push_back(nullptr);
    } catch (const std::bad_alloc&) {
        return Error{ENOMEM};
    }
    const int r = ::rte_eal_init(static_cast<int>(argv.size() - 1), argv.data());
    if (r < 0) {
        const int e = rte_errno > 0 ? rte_errno : EINVAL;
        gState = EalState::kFailed;
        gFailure = e;
        report(why, fmt::format("rte_eal_init({}) failed: {} ({}); EAL's own messages above name the "
                                "argument it could not use",
                                joined(*args), ::rte_strerror(e), e));
        return Error{e};
    }
    gState = EalState::kRunning;
    gRunning.store(true, std::memory_order_release);
    try {
        gRuntimeDir = ::rte_eal_get_runtime_dir();
    } catch (const std::bad_alloc&) {
        gRuntimeDir.clear();
    }
    (void)std::atexit(&removeRuntimeDir);
    log::info("dpdk: EAL up: {}", joined(*args));
    return {};
}

bool ealRunning() noexcept { return gRunning.load(std::memory_order_acquire); }

Result<void> stopEal() noexcept {
    std::lock_guard<std::mutex> g(gLock);
    if (gState != EalState::kRunning) { return Error{ENXIO}; }
    if (gRegistered.load(std::memory_order_acquire) != 0) { return Error{EBUSY}; }
    gRunning.store(false, std::memory_order_release);
    gState = EalState::kStopped;
    (void)::rte_eal_cleanup();
    // --no-shconf still makes a runtime directory (empty once EAL is down): leave nothing behind.
    if (!gRuntimeDir.empty()) {
        std::error_code ec;
        std::filesystem::remove(gRuntimeDir, ec);
        gRuntimeDir.clear();
    }
    return {};
}

Result<void> registerThread() noexcept {
    if (!ealRunning()) { return Error{ENXIO}; }
    if (tlsUsers > 0) {
        ++tlsUsers;
        return {};
    }
    if (::rte_thread_register() != 0) {
        const int e = rte_errno > 0 ? rte_errno : EINVAL;
        return Error{e == ENOMEM ? ENOSPC : e};  // DPDK says ENOMEM for "no lcore id left"
    }
    tlsUsers = 1;
    gRegistered.fetch_add(1, std::memory_order_acq_rel);
    return {};
}

void unregisterThread() noexcept {
    if (tlsUsers == 0) { return; }
    if (--tlsUsers > 0) { return; }
    ::rte_thread_unregister();
    gRegistered.fetch_sub(1, std::memory_order_acq_rel);
}

}  // namespace spindle::dpdk
