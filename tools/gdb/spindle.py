# SPDX-License-Identifier: Apache-2.0
# gdb commands for spindle programs: the fibers of a live process or a core file, and the frames of a
# suspended fiber.
#
#   (gdb) source tools/gdb/spindle.py      # or: gdb -x tools/gdb/spindle.py ...
#   (gdb) spindle fibers                   # every listed fiber of every runtime
#   (gdb) spindle bt 12                    # the backtrace of suspended fiber 12
#   (gdb) spindle switch 12                # make fiber 12's frames the current ones (frame, up, info locals)
#   (gdb) spindle restore                  # back to the thread's own registers
#
# What it reads (core/introspect.cpp, core/internal/fiber.h): spindle_debug_runtimes, each runtime's
# carriers through RuntimeImpl::debugCarriers_ and Carrier::debugNext_, and each carrier's list of the
# fibers that first suspended on it (Carrier::homeHead_, Fiber::homeNext_), plus the fiber each carrier
# runs now (Carrier::current_). A suspended fiber's registers are in the frame its context switch pushed
# at Fiber::sp_ (SwitchFrame, core/internal/context.h); `bt` and `switch` load them into the selected
# thread (a live process: gdb writes registers; a core file: gdb keeps the change in its own cache) and
# `restore` puts the thread's own back. Needs the program's debug information (-g).

import gdb

_saved = None  # (thread, {register: value}) while `spindle switch` is in force


def _arch():
    name = gdb.selected_frame().architecture().name() if gdb.selected_thread() else ""
    if "aarch64" in name:
        return "aarch64"
    if "x86-64" in name or "x86_64" in name:
        return "x86_64"
    raise gdb.GdbError("spindle: unsupported architecture '%s'" % name)


def _runtimes():
    try:
        rt = gdb.parse_and_eval("spindle_debug_runtimes")
    except gdb.error as e:
        raise gdb.GdbError("spindle: no spindle_debug_runtimes here (not a spindle program, or no debug "
                           "information): %s" % e)
    while int(rt) != 0:
        yield rt
        rt = rt["debugNext_"]


def _carriers(rt):
    c = rt["debugCarriers_"]
    while int(c) != 0:
        yield c
        c = c["debugNext_"]


def _fibers():
    """(runtime index, carrier, fiber, how) for every fiber gdb can find."""
    seen = set()
    for r, rt in enumerate(_runtimes()):
        for c in _carriers(rt):
            cur = c["current_"]
            if int(cur) != 0:
                seen.add(int(cur))
                yield r, c, cur, "running"
            f = c["homeHead_"]
            while int(f) != 0:
                if int(f) not in seen:
                    seen.add(int(f))
                    yield r, c, f, "listed"
                f = f["homeNext_"]


def _state(f):
    s = f["state_"]
    try:
        s = s["_M_i"]
    except gdb.error:
        pass
    return str(s).split("::")[-1].lstrip("k").lower()


def _name(f):
    try:
        return f["name_"].string()
    except gdb.error:
        return "?"


def _wait(f):
    """': io read fd 7', ': join fiber 3', ': mutex 0x...' (as Runtime::fibers says it), or ''."""
    kind = str(f["waitKind_"]).split("::")[-1]
    if kind == "kNone":
        return ""
    word = kind[1:].lower()
    obj = f["waitObject_"]
    try:
        if kind in ("kIo", "kMultishot") and int(obj) != 0:
            o = obj.cast(gdb.lookup_type("spindle::op::Op").pointer()).dereference()
            code = str(o["code"]).split("::")[-1][1:].lower()
            return ": %s %s fd %d" % (word, code, int(o["fd"]))
        if kind == "kJoin" and int(obj) != 0:
            return ": join fiber %d" % int(obj.cast(f.type)["id_"])
    except gdb.error:
        pass
    return ": %s %s" % (word, obj)


def _find(fid):
    for r, c, f, how in _fibers():
        if int(f["id_"]) == fid:
            return f
    raise gdb.GdbError("spindle: no listed fiber with id %d (`spindle fibers` shows them)" % fid)


def _switch_frame(f):
    """The registers a suspended fiber resumes with: {name: value}."""
    if _state(f) != "suspended":
        raise gdb.GdbError("spindle: fiber %d is %s, not suspended: its registers are its thread's"
                           % (int(f["id_"]), _state(f)))
    sp = int(f["sp_"])
    try:
        frame_type = gdb.lookup_type("spindle::detail::SwitchFrame")
    except gdb.error:
        raise gdb.GdbError("spindle: no debug information for spindle::detail::SwitchFrame")
    frame = gdb.Value(sp).cast(frame_type.pointer()).dereference()
    ret = int(frame["returnAddress"])
    after = sp + frame_type.sizeof  # the stack pointer once the switch has returned
    if _arch() == "x86_64":
        regs = {n: int(frame[n]) for n in ("r15", "r14", "r13", "r12", "rbx", "rbp")}
        regs["rip"] = ret
        regs["rsp"] = after
    else:
        regs = {"x19": int(frame["x19"]), "x20": int(frame["x20"]), "x29": int(frame["x29"])}
        for i in range(8):
            regs["x%d" % (21 + i)] = int(frame["x21ToX28"][i])
        regs["x30"] = ret
        regs["pc"] = ret
        regs["sp"] = after
    return regs


def _load(regs):
    global _saved
    # Registers are set in the innermost frame: with an outer frame selected, `set $rip` would write that
    # frame's saved copy, which is memory (a stack), not the register.
    gdb.newest_frame().select()
    if _saved is None:
        frame = gdb.newest_frame()
        _saved = (gdb.selected_thread(), {n: int(frame.read_register(n)) for n in regs})
    for name, value in regs.items():
        gdb.execute("set $%s = %d" % (name, value), to_string=True)
    gdb.invalidate_cached_frames()


def _restore():
    global _saved
    if _saved is None:
        return False
    thread, regs = _saved
    _saved = None
    if thread.is_valid():
        thread.switch()
        gdb.newest_frame().select()
        for name, value in regs.items():
            gdb.execute("set $%s = %d" % (name, value), to_string=True)
        gdb.invalidate_cached_frames()
    return True


class Spindle(gdb.Command):
    """Commands for spindle programs: spindle fibers | bt ID | switch ID | restore."""

    def __init__(self):
        super().__init__("spindle", gdb.COMMAND_USER, gdb.COMPLETE_NONE, True)


class SpindleFibers(gdb.Command):
    """List the fibers of every spindle runtime: id, name, state, carrier, what it waits for.

A fiber is listed from its first suspension on (core/introspect.cpp); the fiber each carrier runs now is
listed too."""

    def __init__(self):
        super().__init__("spindle fibers", gdb.COMMAND_USER)

    def invoke(self, arg, from_tty):
        count = 0
        for r, c, f, how in _fibers():
            line = "runtime %d carrier %d: fiber %d '%s' %s" % (
                r, int(c["config_"]["index"]), int(f["id_"]), _name(f), _state(f))
            if _state(f) == "suspended":
                line += _wait(f)
            gdb.write(line + "\n")
            count += 1
        gdb.write("%d fibers\n" % count)


class SpindleBt(gdb.Command):
    """Print the backtrace of a suspended fiber: spindle bt ID."""

    def __init__(self):
        super().__init__("spindle bt", gdb.COMMAND_USER)

    def invoke(self, arg, from_tty):
        fid = _parse_id(arg)
        regs = _switch_frame(_find(fid))
        _load(regs)
        try:
            gdb.execute("bt", from_tty)
        finally:
            _restore()


class SpindleSwitch(gdb.Command):
    """Make a suspended fiber's frames the current ones (until `spindle restore`): spindle switch ID."""

    def __init__(self):
        super().__init__("spindle switch", gdb.COMMAND_USER)

    def invoke(self, arg, from_tty):
        fid = _parse_id(arg)
        regs = _switch_frame(_find(fid))
        _load(regs)
        gdb.write("fiber %d: its frames are the current ones; `spindle restore` to go back\n" % fid)
        gdb.execute("frame 0", from_tty)


class SpindleRestore(gdb.Command):
    """Undo `spindle switch`: the thread's own registers again."""

    def __init__(self):
        super().__init__("spindle restore", gdb.COMMAND_USER)

    def invoke(self, arg, from_tty):
        gdb.write("restored\n" if _restore() else "nothing to restore\n")


def _parse_id(arg):
    try:
        return int(arg.strip(), 0)
    except ValueError:
        raise gdb.GdbError("spindle: a fiber id, as `spindle fibers` shows it")


Spindle()
SpindleFibers()
SpindleBt()
SpindleSwitch()
SpindleRestore()
