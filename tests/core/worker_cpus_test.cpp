// SPDX-License-Identifier: Apache-2.0
// Tests for where the runtime's helper threads run (RuntimeOptions::workerCpus): the offload pool runs on
// the CPUs of the thread that started the runtime, not on the one CPU of the carrier whose offload()
// started it; with workerCpus, the pool and the kernel's io_uring workers (io-wq) of every carrier run
// on those CPUs; a CPU the starting thread may not use, and the kernel's refusal, fail start() with a
// message; so does a start() that cannot read its own CPUs when workerCpus are given, and a pool thread
// that cannot move stays where it was born and still runs the work.
//
// Every verdict is read from the kernel (sched_getaffinity of the thread itself, or of the io-wq worker's
// task), never from what the runtime believes. No verdict depends on timing. The placement tests need
// two CPUs (one for the carrier, one for the helpers) and skip on one, where they could not fail.

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/inject.h"
#include "core/io.h"
#include "core/offload.h"
#include "core/runtime.h"
#include "numa/placement.h"
#include "testing/scratch_dir.h"
#include "tests/core/with_runtime.h"

namespace spindle {
namespace {

using namespace testing_support;

std::vector<unsigned> cpusOf(pid_t tid) {
    cpu_set_t set;
    CPU_ZERO(&set);
    std::vector<unsigned> out;
    if (::sched_getaffinity(tid, sizeof set, &set) != 0) { return out; }
    for (unsigned i = 0; i < CPU_SETSIZE; ++i) {
        if (CPU_ISSET(i, &set)) { out.push_back(i); }
    }
    return out;
}

// The CPUs of the offload pool's thread that runs one offload() from a fiber pinned to `carrier`.
std::vector<unsigned> offloadThreadCpus(Runtime& rt, int carrier) {
    auto f = rt.spawn([] { return offload([] { return cpusOf(0); }); },
                      SpawnOptions{.carrier = carrier, .pinned = true});
    if (!f) { return {}; }
    auto r = f->join();
    return r ? *r : std::vector<unsigned>{};
}

// The threads of this process named as io-wq workers of the thread `owner` ("iou-wrk-<tid>", cut to the
// 15 bytes a thread name holds).
std::vector<pid_t> ioWorkersOf(pid_t owner) {
    const std::string want = ("iou-wrk-" + std::to_string(owner)).substr(0, 15);
    std::vector<pid_t> out;
    DIR* d = ::opendir("/proc/self/task");
    if (d == nullptr) { return out; }
    while (const dirent* e = ::readdir(d)) {
        if (e->d_name[0] == '.') { continue; }
        std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
        std::string name;
        if (std::getline(comm, name) && name == want) { out.push_back(static_cast<pid_t>(std::stoi(e->d_name))); }
    }
    ::closedir(d);
    return out;
}

// A runtime's carrier 0 makes an fdatasync, which io_uring always hands to an io-wq worker; returns the
// CPU lists of carrier 0's workers, read while the one that ran it still exists (an idle worker lives
// for seconds).
std::vector<std::vector<unsigned>> carrierWorkerCpus(Runtime& rt, const std::string& dir) {
    std::vector<std::vector<unsigned>> out;
    auto f = rt.spawn(
        [&] {
            const std::string path = dir + "/synced";
            const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            EXPECT_GE(fd, 0) << std::strerror(errno);
            if (fd < 0) { return; }
            const char bytes[512] = {1};
            EXPECT_TRUE(spindle::write(fd, bytes, sizeof bytes, 0));
            auto synced = spindle::fdatasync(fd);
            EXPECT_TRUE(synced) << synced.error().message();
            for (const pid_t w : ioWorkersOf(static_cast<pid_t>(::gettid()))) { out.push_back(cpusOf(w)); }
            ::close(fd);
        },
        SpawnOptions{.carrier = 0, .pinned = true});
    EXPECT_TRUE(f);
    if (f) { f->join(); }
    return out;
}

TEST(WorkerCpus, OffloadPoolRunsOnTheStartingThreadsCpusNotOnTheCarriers) {
    const std::vector<unsigned> mine = cpusOf(0);
    if (mine.size() < 2) { GTEST_SKIP() << "one CPU: a pool on the carrier's CPU and on the process's look alike"; }
    auto rt = Runtime::start(withCarriers(2));
    ASSERT_TRUE(rt) << rt.error().message();
    if (rt->stats()[0].pu < 0) { GTEST_SKIP() << "carrier 0 runs unbound here: its CPUs are the process's"; }
    // The first offload() starts the pool from carrier 0's thread, which is bound to one CPU.
    EXPECT_EQ(offloadThreadCpus(*rt, 0), mine);
    EXPECT_EQ(offloadThreadCpus(*rt, 1), mine);
}

// One carrier on the first of this thread's CPUs (bound where the machine lets hwloc bind).
RuntimeOptions oneCarrierOn(unsigned cpu) {
    RuntimeOptions o = withCarriers(1);
    o.placement = numa::Placement::kExplicit;
    o.explicitPus = {cpu};
    return o;
}

TEST(WorkerCpus, OffloadPoolRunsOnTheGivenCpus) {
    const std::vector<unsigned> mine = cpusOf(0);
    if (mine.size() < 2) { GTEST_SKIP() << "one CPU: the given CPU would be the carrier's too"; }
    RuntimeOptions o = oneCarrierOn(mine.front());
    o.workerCpus = {mine.back()};
    auto rt = Runtime::start(o);
    ASSERT_TRUE(rt) << rt.error().message();
    EXPECT_EQ(offloadThreadCpus(*rt, 0), std::vector<unsigned>{mine.back()});
}

TEST(WorkerCpus, IoUringWorkersRunOnTheGivenCpus) {
    SPINDLE_REQUIRE_URING("io-wq workers are io_uring's threads");
    const std::vector<unsigned> mine = cpusOf(0);
    if (mine.size() < 2) { GTEST_SKIP() << "one CPU: the given CPU would be the carrier's too"; }
    ScratchDir scratch;
    ASSERT_TRUE(scratch.ok());
    // Without workerCpus a bound carrier's workers share its CPU (the first); with it, the last alone.
    RuntimeOptions o = oneCarrierOn(mine.front());
    o.workerCpus = {mine.back()};
    auto rt = Runtime::start(o);
    ASSERT_TRUE(rt) << rt.error().message();
    const auto workers = carrierWorkerCpus(*rt, scratch.dir());
    ASSERT_FALSE(workers.empty()) << "no io-wq worker of carrier 0 after an fdatasync";
    for (const auto& cpus : workers) { EXPECT_EQ(cpus, std::vector<unsigned>{mine.back()}); }
}

TEST(WorkerCpus, ACpuTheStartingThreadMayNotUseIsRefused) {
    RuntimeOptions o = withCarriers(1);
    o.workerCpus = {CPU_SETSIZE + 1u};
    testing::internal::CaptureStderr();
    auto rt = Runtime::start(o);
    std::string logged = testing::internal::GetCapturedStderr();
    ASSERT_FALSE(rt);
    EXPECT_EQ(rt.errorCode(), EINVAL);
    EXPECT_NE(logged.find("workerCpus holds CPU " + std::to_string(CPU_SETSIZE + 1)), std::string::npos) << logged;

    // A CPU of the machine that the starting thread is not allowed: start from a thread pinned to one.
    const std::vector<unsigned> mine = cpusOf(0);
    if (mine.size() < 2) { GTEST_SKIP() << "one CPU: no CPU of this machine is outside the starting thread's"; }
    int err = 0;
    std::thread([&] {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(mine.front(), &one);
        if (::sched_setaffinity(0, sizeof one, &one) != 0) {
            err = -errno;  // refused here (a sandbox): skipped below
            return;
        }
        RuntimeOptions p = withCarriers(1);
        p.workerCpus = {mine.front(), mine.back()};
        testing::internal::CaptureStderr();
        auto r = Runtime::start(p);
        logged = testing::internal::GetCapturedStderr();
        err = r ? 0 : r.errorCode();
    }).join();
    if (err < 0) { GTEST_SKIP() << "sched_setaffinity refused here: " << std::strerror(-err); }
    EXPECT_EQ(err, EINVAL);
    EXPECT_NE(logged.find("workerCpus holds CPU " + std::to_string(mine.back())), std::string::npos) << logged;
    EXPECT_NE(logged.find("it may run on " + std::to_string(mine.front()) + ")"), std::string::npos) << logged;
}

// The kernel narrows a new io-wq worker to its bound carrier's CPU whenever the worker set holds it, so
// a set that holds a carrier's CPU would leave that carrier's workers where they were: refused.
TEST(WorkerCpus, ASetHoldingABoundCarriersCpuIsRefused) {
    const std::vector<unsigned> mine = cpusOf(0);
    ASSERT_FALSE(mine.empty());
    {
        auto probe = Runtime::start(oneCarrierOn(mine.front()));
        ASSERT_TRUE(probe) << probe.error().message();
        if (probe->stats()[0].pu < 0) { GTEST_SKIP() << "carriers run unbound here: no CPU of theirs to leave out"; }
    }
    RuntimeOptions o = oneCarrierOn(mine.front());
    o.workerCpus = mine;  // every CPU, the carrier's among them
    testing::internal::CaptureStderr();
    auto rt = Runtime::start(o);
    const std::string logged = testing::internal::GetCapturedStderr();
    ASSERT_FALSE(rt);
    EXPECT_EQ(rt.errorCode(), EINVAL);
    EXPECT_NE(logged.find("workerCpus holds CPU " + std::to_string(mine.front()) + ", where carrier 0 is bound"),
              std::string::npos)
        << logged;
}

// Runtime::start(o) with `point` armed to fail once with `err`: expects start() to fail with err and the
// fault to have been taken; returns what start() logged.
std::string startFailingAt(inject::Point point, int err, const RuntimeOptions& o) {
    inject::ArmedFault f(point, err);
    testing::internal::CaptureStderr();
    auto rt = Runtime::start(o);
    std::string logged = testing::internal::GetCapturedStderr();
    EXPECT_FALSE(rt);
    if (!rt) { EXPECT_EQ(rt.errorCode(), err); }
    EXPECT_EQ(inject::remaining(point), 0u) << "start() never came to the fault point";
    return logged;
}

TEST(WorkerCpus, TheKernelsRefusalFailsStartWithItsError) {
    SPINDLE_REQUIRE_URING("IORING_REGISTER_IOWQ_AFF is io_uring's");
    const std::vector<unsigned> mine = cpusOf(0);
    if (mine.size() < 2) { GTEST_SKIP() << "one CPU: no CPU to give the workers beside the carrier's"; }
    RuntimeOptions o = oneCarrierOn(mine.front());
    o.workerCpus = {mine.back()};
    const std::string logged = startFailingAt(inject::Point::kRegisterIowqAff, EINVAL, o);
    EXPECT_NE(logged.find("IORING_REGISTER_IOWQ_AFF"), std::string::npos) << logged;
    EXPECT_NE(logged.find(std::strerror(EINVAL)), std::string::npos) << logged;
    // Nothing is left armed or broken: the same options start now.
    auto rt = Runtime::start(o);
    EXPECT_TRUE(rt) << rt.error().message();
}

// start() reads the CPUs of its thread to place the helper threads. When it cannot (kThreadAffinity in
// place of sched_getaffinity): with workerCpus, start() fails with that errno and says why; without, it
// starts, and the offload pool's threads stay where they are born.
TEST(WorkerCpus, StartThatCannotReadItsCpusFailsOnlyWhenWorkerCpusAreGiven) {
    const std::vector<unsigned> mine = cpusOf(0);
    ASSERT_FALSE(mine.empty());
    RuntimeOptions o = withCarriers(1);
    o.workerCpus = {mine.back()};  // the fault comes before any check of the set
    const std::string logged = startFailingAt(inject::Point::kThreadAffinity, ESRCH, o);
    EXPECT_NE(logged.find("workerCpus: this thread's CPUs are unknown (sched_getaffinity: " +
                          std::string(std::strerror(ESRCH)) + ")"),
              std::string::npos)
        << logged;

    // Without workerCpus the same failure costs nothing: the pool runs, where its threads are born (on
    // the CPU of the carrier whose offload() started them, bound to one).
    inject::ArmedFault f(inject::Point::kThreadAffinity, ESRCH);
    auto rt = Runtime::start(oneCarrierOn(mine.front()));
    ASSERT_TRUE(rt) << rt.error().message();
    EXPECT_EQ(inject::remaining(inject::Point::kThreadAffinity), 0u) << "start() did not read its CPUs";
    const std::vector<unsigned> cpus = offloadThreadCpus(*rt, 0);
    ASSERT_FALSE(cpus.empty()) << "the offload did not run";
    if (rt->stats()[0].pu >= 0 && mine.size() >= 2) { EXPECT_EQ(cpus, std::vector<unsigned>{mine.front()}); }
}

// An offload pool thread that cannot move to its CPUs (kThreadAffinity in place of
// pthread_setaffinity_np: a cpuset changed since start) logs a warning, stays on the CPUs it was born
// with (its creator's: here a carrier bound to one CPU), and runs the work all the same.
TEST(WorkerCpus, APoolThreadThatCannotMoveWarnsAndStillRunsTheWork) {
    const std::vector<unsigned> mine = cpusOf(0);
    if (mine.size() < 2) { GTEST_SKIP() << "one CPU: born where it should go, a thread's move cannot be told"; }
    auto rt = Runtime::start(oneCarrierOn(mine.front()));
    ASSERT_TRUE(rt) << rt.error().message();
    if (rt->stats()[0].pu < 0) { GTEST_SKIP() << "carrier 0 runs unbound here: its CPUs are the process's"; }
    // Armed after start() read its CPUs, for every thread the pool starts at once (it starts them all
    // on the first offload()).
    inject::ArmedFault f(inject::Point::kThreadAffinity, EINVAL, 1024);
    testing::internal::CaptureStderr();
    const std::vector<unsigned> cpus = offloadThreadCpus(*rt, 0);
    const std::string logged = testing::internal::GetCapturedStderr();
    EXPECT_EQ(cpus, std::vector<unsigned>{mine.front()}) << "not the creator's (carrier 0's) CPU";
    EXPECT_NE(logged.find("offload pool: a thread could not be placed on its CPUs: " + std::string(std::strerror(EINVAL))),
              std::string::npos)
        << logged;
}

}  // namespace
}  // namespace spindle
