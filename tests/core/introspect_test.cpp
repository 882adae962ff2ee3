// SPDX-License-Identifier: Apache-2.0
// Tests for seeing inside a running runtime (core/introspect.cpp): Runtime::fibers() lists every live
// fiber with what it waits for and a backtrace unwound from its saved context; a carrier that does not
// pause is named rather than waited for; join() after shutdown() reports the fibers that keep it waiting,
// joinFor() gives up with ETIMEDOUT, and join() before shutdown() is a checked precondition; the stall
// detector reports a fiber that runs without switching out, once, with its backtrace; SIGUSR1 prints the
// listing.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <dirent.h>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/fiber.h"
#include "core/fiber_event.h"
#include "core/fiber_mutex.h"
#include "core/io.h"
#include "core/offload.h"
#include "core/runtime.h"
#include "testing/scoped_env.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using namespace std::chrono_literals;
using testing_support::Pipe;
using testing_support::yieldUntil;

const FiberInfo* byName(const FiberListing& l, const std::string& name) {
    auto it = std::find_if(l.fibers.begin(), l.fibers.end(), [&](const FiberInfo& f) { return f.name == name; });
    return it != l.fibers.end() ? &*it : nullptr;
}

bool anyFrameHas(const FiberInfo& f, const std::string& text) {
    return std::any_of(f.backtrace.begin(), f.backtrace.end(),
                       [&](const std::string& frame) { return frame.find(text) != std::string::npos; });
}

/// Polls the listing until `n` fibers named in `names` are suspended (each has reached its wait).
FiberListing listingOnceSuspended(Runtime& rt, const std::vector<std::string>& names) {
    for (;;) {
        FiberListing l = rt.fibers(true);
        const bool all = std::all_of(names.begin(), names.end(), [&](const std::string& n) {
            const FiberInfo* f = byName(l, n);
            return f != nullptr && f->state == "suspended";
        });
        if (all) { return l; }
        std::this_thread::sleep_for(1ms);
    }
}

// Noinline and named, so that a backtrace has a frame of the test's own to find.
[[gnu::noinline]] int readOneByte(int fd) {
    char c = 0;
    auto r = spindle::read(fd, &c, 1);
    return r ? static_cast<int>(*r) : -r.errorCode();
}

class Introspect : public testing_support::WithRuntime {};

TEST_F(Introspect, ListsEveryFiberWithWhatItWaitsForAndItsBacktrace) {
    Pipe p;
    FiberMutex mutex;
    FiberEvent event;
    FiberEvent release;
    mutex.lock();  // the test thread holds it: the locker waits
    auto reader = on(0, [&] { return readOneByte(p.r); }, "reader");
    auto sleeper = on(1, [&] { return this_fiber::sleep_for(1h).errorCode(); }, "sleeper");
    auto locker = on(0, [&] {
        mutex.lock();
        mutex.unlock();
    }, "locker");
    auto waiter = on(1, [&] { event.wait(); }, "event-waiter");
    auto target = on(0, [&] { release.wait(); }, "join-target");
    const uint64_t targetId = target.id();
    auto joiner = on(1, [&] { target.join(); }, "joiner");
    auto offloader = on(0, [&] {
        (void)offload([&] { release.wait(); });
    }, "offloader");

    const FiberListing l = listingOnceSuspended(
        rt(), {"reader", "sleeper", "locker", "event-waiter", "join-target", "joiner", "offloader"});
    EXPECT_TRUE(l.unanswered.empty());
    EXPECT_EQ(l.live, 7u);
    EXPECT_EQ(l.fibers.size(), 7u) << formatFiberListing(l);

    const FiberInfo* r = byName(l, "reader");
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->waitKind, "io");
    EXPECT_EQ(r->waitDetail, "read fd " + std::to_string(p.r));
    EXPECT_EQ(r->carrier, 0);
    EXPECT_EQ(r->id, reader.id());
    EXPECT_TRUE(anyFrameHas(*r, "readOneByte")) << formatFiberListing(l);
    EXPECT_TRUE(anyFrameHas(*r, "spindle::read")) << formatFiberListing(l);

    const FiberInfo* s = byName(l, "sleeper");
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->waitKind, "sleep");
    EXPECT_NE(s->waitDetail.find("deadline in "), std::string::npos) << s->waitDetail;
    EXPECT_EQ(s->carrier, 1);

    const FiberInfo* m = byName(l, "locker");
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(m->waitKind, "mutex");
    EXPECT_TRUE(anyFrameHas(*m, "FiberMutex")) << formatFiberListing(l);

    const FiberInfo* e = byName(l, "event-waiter");
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->waitKind, "sequencer");

    const FiberInfo* j = byName(l, "joiner");
    ASSERT_NE(j, nullptr);
    EXPECT_EQ(j->waitKind, "join");
    EXPECT_EQ(j->waitDetail, "fiber " + std::to_string(targetId));

    const FiberInfo* o = byName(l, "offloader");
    ASSERT_NE(o, nullptr);
    EXPECT_EQ(o->waitKind, "offload");

    const std::string text = formatFiberListing(l);
    EXPECT_NE(text.find("fibers: 7 live, 7 listed"), std::string::npos) << text;
    EXPECT_NE(text.find("'reader' suspended"), std::string::npos) << text;

    // Let everything finish.
    ASSERT_EQ(::write(p.w, "x", 1), 1);
    EXPECT_EQ(reader.join(), 1);
    sleeper.cancel();
    EXPECT_EQ(sleeper.join(), ECANCELED);
    mutex.unlock();
    locker.join();
    event.set();
    waiter.join();
    release.set();
    joiner.join();
    offloader.join();
}

TEST_F(Introspect, AFiberListsItselfAsRunning) {
    auto h = on(1, [&] {
        const FiberListing l = rt().fibers(true);
        const FiberInfo* self = byName(l, "lister");
        return self != nullptr && self->state == "running" && self->carrier == 1 && self->backtrace.empty() &&
               l.unanswered.empty();
    }, "lister");
    EXPECT_TRUE(h.join());
}

TEST_F(Introspect, ACarrierThatDoesNotPauseIsNamedAndTheRestIsListed) {
    std::atomic<bool> spin{true};
    std::atomic<bool> spinning{false};
    auto spinner = on(0, [&] {
        spinning.store(true);
        while (spin.load()) {}  // never yields: carrier 0 cannot pause
    }, "spinner");
    FiberEvent go;
    auto waiter = on(1, [&] { go.wait(); }, "waiter");
    yieldUntil([&] { return spinning.load(); });
    FiberListing l;
    for (;;) {
        l = rt().fibers(true, 50ms);
        const FiberInfo* w = byName(l, "waiter");
        if (w != nullptr && w->state == "suspended") { break; }
    }
    ASSERT_EQ(l.unanswered, std::vector<unsigned>{0});
    EXPECT_EQ(byName(l, "spinner"), nullptr) << "carrier 0 lists it, and carrier 0 did not pause";
    EXPECT_TRUE(byName(l, "waiter")->backtrace.empty()) << "no backtraces unless every carrier paused";
    EXPECT_NE(formatFiberListing(l).find("did not pause (their fibers are missing): 0"), std::string::npos);
    spin.store(false);
    spinner.join();
    go.set();
    waiter.join();
    // Carrier 0 handles the late pause message and carries on.
    EXPECT_TRUE(rt().fibers().unanswered.empty());
}

// ---- shutdown ---------------------------------------------------------------------------------------------

TEST(IntrospectShutdown, JoinForNamesTheFibersThatKeepItWaiting) {
    RuntimeOptions o;
    o.carriers = 2;
    auto rt = Runtime::start(o);
    ASSERT_TRUE(rt);
    FiberMutex mutex;
    mutex.lock();
    auto h = rt->spawn([&] {
        mutex.lock();  // untimed: shutdown does not end it
        mutex.unlock();
    }, SpawnOptions{.name = "stuck-locker"});
    ASSERT_TRUE(h);
    (void)listingOnceSuspended(*rt, {"stuck-locker"});
    rt->shutdown();
    testing::internal::CaptureStderr();
    const auto r = rt->joinFor(100ms);
    const std::string logged = testing::internal::GetCapturedStderr();
    EXPECT_EQ(r.errorCode(), ETIMEDOUT);
    EXPECT_NE(logged.find("1 fibers are still alive"), std::string::npos) << logged;
    EXPECT_NE(logged.find("'stuck-locker' suspended"), std::string::npos) << logged;
    EXPECT_NE(logged.find(": mutex "), std::string::npos) << logged;
    EXPECT_NE(logged.find("FiberMutex"), std::string::npos) << "a backtrace frame:\n" << logged;
    mutex.unlock();
    h->join();
    EXPECT_TRUE(rt->joinFor(10s));
}

TEST(IntrospectShutdown, JoinReportsOnceAfterTheReportDelayThenWaitsOn) {
    RuntimeOptions o;
    o.carriers = 1;
    o.shutdownReportMs = 50;
    auto rt = Runtime::start(o);
    ASSERT_TRUE(rt);
    FiberEvent release;
    auto h = rt->spawn([&] { release.wait(); }, SpawnOptions{.name = "held-open"});
    ASSERT_TRUE(h);
    rt->shutdown();
    std::thread releaser([&] {
        std::this_thread::sleep_for(300ms);
        release.set();
    });
    testing::internal::CaptureStderr();
    rt->join();
    const std::string logged = testing::internal::GetCapturedStderr();
    releaser.join();
    EXPECT_NE(logged.find("'held-open' suspended"), std::string::npos) << logged;
    EXPECT_NE(logged.find("after 50 ms"), std::string::npos) << logged;
    h->join();
}

TEST(IntrospectShutdownDeathTest, JoinBeforeShutdownIsACheckedPrecondition) {
    // threadsafe re-executes the binary, unless the environment chose a style (the aarch64 flavour,
    // under qemu-user, says "fast": qemu cannot re-execute a foreign binary).
    if (std::getenv("GTEST_DEATH_TEST_STYLE") == nullptr) { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
    EXPECT_DEATH(
        {
            auto rt = Runtime::start(testing_support::withCarriers(1));
            if (!rt) { std::exit(3); }
            rt->join();
        },
        "before Runtime::shutdown\\(\\)");
}

// ---- the stall detector --------------------------------------------------------------------------------------

#if defined(SPINDLE_TSAN)
constexpr bool kTsan = true;
#else
constexpr bool kTsan = false;
#endif

std::atomic<bool> gSpin{false};

/// A runtime's options with `carriers` carriers and the stall detector at `thresholdMs`.
RuntimeOptions stallOptions(unsigned carriers, unsigned thresholdMs) {
    RuntimeOptions o;
    o.carriers = carriers;
    o.stallThresholdMs = thresholdMs;
    return o;
}

[[gnu::noinline]] void spinWithoutYielding(std::chrono::milliseconds d) {
    const auto end = std::chrono::steady_clock::now() + d;
    while (std::chrono::steady_clock::now() < end) { gSpin.store(true, std::memory_order_relaxed); }
}

// Spins (never yielding) until carrier `carrier` has counted a stall, then 300 ms more: the monitor
// counts a stall and then signals the carrier for its sample, so the sample lands in this frame however
// little CPU a loaded machine gives this thread (a fixed 300 ms spin could end before a starved thread
// had run 20 ms, and the sample then found it returning: a clang-checked run under ctest -j2 printed
// no frame of the hog's own). A thread starved past the extra spin takes the pending signal before
// its next instruction, still in here. At most 10 s. The empty asm after the last spin keeps this frame
// on the stack during it: as the last statement, the call was compiled as a tail call (a jmp at -O2),
// and a sample taken in the extra spin then showed spinWithoutYielding called from the fiber's lambda,
// without this function (a release run of scripts/test failed so, once in about fifteen).
[[gnu::noinline]] void spinUntilStalled(Runtime& rt, unsigned carrier) {
    const auto end = std::chrono::steady_clock::now() + 10s;
    while (rt.stats().at(carrier).stalls == 0 && std::chrono::steady_clock::now() < end) {
        spinWithoutYielding(1ms);
    }
    spinWithoutYielding(300ms);
    asm volatile("" ::: "memory");
}

TEST(StallDetector, ReportsAFiberThatRunsWithoutYieldingOnceWithItsBacktrace) {
    auto rt = Runtime::start(stallOptions(2, 20));
    ASSERT_TRUE(rt);
    testing::internal::CaptureStderr();
    Runtime& r = *rt;
    auto h = r.spawn([&r] { spinUntilStalled(r, 1); }, SpawnOptions{.name = "hog", .carrier = 1});
    ASSERT_TRUE(h);
    const uint64_t hogId = h->id();
    h->join();
    // A fiber that yields often is never reported.
    auto polite = rt->spawn([] {
        const auto end = std::chrono::steady_clock::now() + 100ms;
        while (std::chrono::steady_clock::now() < end) { this_fiber::yield(); }
    }, SpawnOptions{.name = "polite", .carrier = 1});
    ASSERT_TRUE(polite);
    polite->join();
    const std::string logged = testing::internal::GetCapturedStderr();
    const auto reports = [&](const std::string& what) {
        size_t n = 0;
        for (size_t at = logged.find(what); at != std::string::npos; at = logged.find(what, at + 1)) { ++n; }
        return n;
    };
    EXPECT_EQ(reports("stall: "), 1u) << logged;
    EXPECT_NE(logged.find("stall: fiber 'hog' (id " + std::to_string(hogId)), std::string::npos) << logged;
    EXPECT_NE(logged.find("on carrier 1 has run for "), std::string::npos) << logged;
    // TSan holds an asynchronous signal back until the thread enters an intercepted call, which a spinning
    // fiber may not do before the monitor stops waiting for the sample: the report comes without frames.
    if (!kTsan) {
        EXPECT_NE(logged.find("    #0 "), std::string::npos) << logged;
        EXPECT_NE(logged.find("spinUntilStalled"), std::string::npos) << "its own frame:\n" << logged;
        EXPECT_EQ(logged.find("onStallSignal"), std::string::npos) << "the handler's frames are left out:\n" << logged;
    }
    EXPECT_EQ(reports("'polite'"), 0u) << logged;
    const auto stats = rt->stats();
    EXPECT_EQ(stats[1].stalls, 1u);
    EXPECT_EQ(stats[0].stalls, 0u);
}

// A fiber that blocks its carrier in a system call (a blocking read of an empty pipe) uses no CPU, and is
// reported all the same: the detector counts wall time while the thread waits in the kernel. (The
// sample's signal does not end the read: SA_RESTART.)
TEST(StallDetector, ReportsAFiberThatBlocksItsCarrierInTheKernel) {
    auto rt = Runtime::start(stallOptions(1, 20));
    ASSERT_TRUE(rt);
    int p[2];
    ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
    testing::internal::CaptureStderr();
    auto h = rt->spawn([&] {
        char c = 0;
        return ::read(p[0], &c, 1);  // blocking: the carrier waits in the kernel
    }, SpawnOptions{.name = "blocker"});
    ASSERT_TRUE(h);
    const auto giveUp = std::chrono::steady_clock::now() + 10s;
    while (rt->stats()[0].stalls == 0 && std::chrono::steady_clock::now() < giveUp) { std::this_thread::sleep_for(1ms); }
    ASSERT_EQ(::write(p[1], "x", 1), 1);
    EXPECT_EQ(h->join(), 1) << "the read got its byte, not EINTR";
    rt->shutdown();
    rt->join();  // the monitor has stopped: its log is complete
    const std::string logged = testing::internal::GetCapturedStderr();
    EXPECT_NE(logged.find("stall: fiber 'blocker'"), std::string::npos) << logged;
    EXPECT_EQ(rt->stats()[0].stalls, 1u) << logged;
    ::close(p[0]);
    ::close(p[1]);
}

// A fiber that yields often is not reported while its carrier's thread waits for the CPU behind other
// threads (a loaded machine): the detector counts the time the fiber ran, less the time its thread
// spent preempted (schedstat's run-queue wait). Before, wall time alone: eight busy threads on the
// carrier's CPU made the polite fiber look stalled again and again.
TEST(StallDetector, AFiberThatYieldsIsNotReportedWhileItsThreadIsPreempted) {
    if (::access("/proc/self/schedstat", R_OK) != 0) { GTEST_SKIP() << "no schedstat in this kernel"; }
    auto rt = Runtime::start(stallOptions(1, 20));
    ASSERT_TRUE(rt);
    auto where = rt->spawn([] { return ::sched_getcpu(); });
    ASSERT_TRUE(where);
    const int cpu = where->join();
    ASSERT_GE(cpu, 0);
    std::atomic<bool> stop{false};
    std::vector<std::thread> hogs;
    for (int i = 0; i < 8; ++i) {
        hogs.emplace_back([&] {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(cpu, &set);
            (void)::pthread_setaffinity_np(::pthread_self(), sizeof(set), &set);
            while (!stop.load(std::memory_order_relaxed)) { gSpin.store(true, std::memory_order_relaxed); }
        });
    }
    testing::internal::CaptureStderr();
    auto polite = rt->spawn([] {
        const auto end = std::chrono::steady_clock::now() + 400ms;
        while (std::chrono::steady_clock::now() < end) { this_fiber::yield(); }
    }, SpawnOptions{.name = "polite"});
    ASSERT_TRUE(polite);
    polite->join();
    stop.store(true);
    for (auto& t : hogs) { t.join(); }
    const std::string logged = testing::internal::GetCapturedStderr();
    EXPECT_EQ(rt->stats()[0].stalls, 0u) << logged;
}

// The voluntary context switches of this process's thread named `name` (-1: none such, or several).
long voluntarySwitchesOf(const std::string& name) {
    long found = -1;
    int matches = 0;
    DIR* dir = ::opendir("/proc/self/task");
    if (dir == nullptr) { return -1; }
    while (dirent* e = ::readdir(dir)) {
        if (e->d_name[0] == '.') { continue; }
        const std::string task = std::string("/proc/self/task/") + e->d_name;
        std::string comm;
        std::getline(std::ifstream(task + "/comm"), comm);
        if (comm != name) { continue; }
        ++matches;
        std::ifstream status(task + "/status");
        for (std::string line; std::getline(status, line);) {
            if (line.rfind("voluntary_ctxt_switches:", 0) == 0) { found = std::stol(line.substr(24)); }
        }
    }
    ::closedir(dir);
    return matches == 1 ? found : -1;
}

TEST(StallDetector, TheMonitorSleepsWhileEveryCarrierIsParkedAndStillCatchesTheNextStall) {
    auto rt = Runtime::start(stallOptions(2, 10));  // a look every 5 ms while a carrier is awake
    ASSERT_TRUE(rt);
    // Let start-up settle (first parks, the stack pool's scavenger), then count the monitor's wake-ups
    // over 500 ms of nothing: 100 if it looked every 5 ms, a handful if it sleeps.
    std::this_thread::sleep_for(300ms);
    const long before = voluntarySwitchesOf("spindle-stall");
    ASSERT_GE(before, 0) << "no single thread named spindle-stall";
    std::this_thread::sleep_for(500ms);
    const long idleWakes = voluntarySwitchesOf("spindle-stall") - before;
    EXPECT_LE(idleWakes, 20) << "the monitor kept looking at parked carriers";
    // A fiber that hogs a carrier right after the idle spell is still reported.
    testing::internal::CaptureStderr();
    Runtime& r = *rt;
    auto h = r.spawn([&r] { spinUntilStalled(r, 0); }, SpawnOptions{.name = "late-hog", .carrier = 0});
    ASSERT_TRUE(h);
    h->join();
    const std::string logged = testing::internal::GetCapturedStderr();
    EXPECT_NE(logged.find("stall: fiber 'late-hog'"), std::string::npos) << logged;
    EXPECT_EQ(rt->stats()[0].stalls, 1u);
    rt->shutdown();
    rt->join();
}

TEST(StallDetector, OffMeansNoMonitorAndNoReport) {
    auto rt = Runtime::start(stallOptions(1, 0));
    ASSERT_TRUE(rt);
    testing::internal::CaptureStderr();
    auto h = rt->spawn([] { spinWithoutYielding(50ms); });
    ASSERT_TRUE(h);
    h->join();
    const std::string logged = testing::internal::GetCapturedStderr();
    EXPECT_EQ(logged.find("stall: "), std::string::npos) << logged;
    EXPECT_EQ(rt->stats()[0].stalls, 0u);
}

TEST(StallDetector, AThresholdOutOfRangeIsRefused) {
    RuntimeOptions o;
    o.carriers = 1;
    o.stallThresholdMs = 60'001;
    testing::internal::CaptureStderr();
    auto rt = Runtime::start(o);
    const std::string logged = testing::internal::GetCapturedStderr();
    EXPECT_EQ(rt.errorCode(), EINVAL);
    EXPECT_NE(logged.find("stallThresholdMs 60001 (0..60000)"), std::string::npos) << logged;
}

TEST(StallDetector, ABadSpindleStallMsIsRefusedAndAGoodOneWins) {
    {
        testing_support::ScopedEnv env("SPINDLE_STALL_MS", "ten");
        testing::internal::CaptureStderr();
        auto rt = Runtime::start(testing_support::withCarriers(1));
        const std::string logged = testing::internal::GetCapturedStderr();
        EXPECT_EQ(rt.errorCode(), EINVAL);
        EXPECT_NE(logged.find("invalid SPINDLE_STALL_MS 'ten'"), std::string::npos) << logged;
    }
    {
        testing_support::ScopedEnv env("SPINDLE_STALL_MS", "0");  // off, whatever the options say
        auto rt = Runtime::start(stallOptions(1, 1));
        ASSERT_TRUE(rt);
        testing::internal::CaptureStderr();
        rt->spawn([] { spinWithoutYielding(30ms); }).value().join();
        const std::string logged = testing::internal::GetCapturedStderr();
        EXPECT_EQ(logged.find("stall: "), std::string::npos) << logged;
    }
}

TEST(IntrospectShutdown, AReportDelayOutOfRangeIsRefused) {
    RuntimeOptions o;
    o.carriers = 1;
    o.shutdownReportMs = 3'600'001;
    testing::internal::CaptureStderr();
    auto rt = Runtime::start(o);
    const std::string logged = testing::internal::GetCapturedStderr();
    EXPECT_EQ(rt.errorCode(), EINVAL);
    EXPECT_NE(logged.find("shutdownReportMs 3600001 (0..3600000)"), std::string::npos) << logged;
}

// ---- SIGUSR1 ---------------------------------------------------------------------------------------------------

TEST(FiberListOnSignal, Sigusr1PrintsTheListingToStderr) {
    RuntimeOptions o;
    o.carriers = 1;
    o.fiberListOnSignal = true;
    auto rt = Runtime::start(o);
    ASSERT_TRUE(rt);
    FiberEvent release;
    auto h = rt->spawn([&] { release.wait(); }, SpawnOptions{.name = "signal-listed"});
    ASSERT_TRUE(h);
    (void)listingOnceSuspended(*rt, {"signal-listed"});
    testing::internal::CaptureStderr();
    ASSERT_EQ(::kill(::getpid(), SIGUSR1), 0);
    std::this_thread::sleep_for(500ms);  // the listing thread writes it; it takes a few ms
    const std::string logged = testing::internal::GetCapturedStderr();
    EXPECT_NE(logged.find("'signal-listed' suspended"), std::string::npos) << logged;
    EXPECT_NE(logged.find("#0 0x"), std::string::npos) << "with backtraces:\n" << logged;
    release.set();
    h->join();
}

}  // namespace
}  // namespace spindle
