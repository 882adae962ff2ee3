#!/usr/bin/env python3
# Checks the man pages that cmake/manpages.cmake makes with help2man: each page renders with groff's man
# macros with no warning at all (-ww), has the sections a reader looks for, and names every flag that its
# program's help (the same --help-all or --help help2man read) names.
#
# usage: check_man_pages.py [--groff PATH] --page PAGE.1.gz PROGRAM HELP [--page ...]
#        HELP is the help flag without its dashes: help or help-all
#        check_man_pages.py --self-test [--groff PATH]
# --self-test checks the checker: a page with a groff warning and a page missing a flag must both fail.
# Exit status: 0 when every page passes, 1 when one fails (each problem on stderr), 2 on bad usage.
# SPDX-License-Identifier: Apache-2.0
import argparse
import gzip
import os
import re
import subprocess
import sys

REQUIRED_SECTIONS = ["NAME", "SYNOPSIS", "DESCRIPTION", "EXIT STATUS", "ENVIRONMENT"]
FLAG = re.compile(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*|-[a-zA-Z])(?![\w-])")


def render(groff, source):
    """Renders man(7) source to plain text; returns (text, warnings)."""
    env = dict(os.environ, GROFF_NO_SGR="1", LC_ALL="C.UTF-8")
    # One long line per paragraph and no hyphenation, so that no flag is split; every warning on (-ww).
    proc = subprocess.run([groff, "-man", "-Tutf8", "-ww", "-rLL=400n", "-rHY=0", "-P-c", "-P-b", "-P-u"],
                          input=source.encode(), capture_output=True, env=env, timeout=60)
    text = proc.stdout.decode("utf-8", "replace")
    text = re.sub(".\b", "", text)  # any overstrike left
    for dash in ("\u2010", "\u2011", "\u2012", "\u2013", "\u2212"):  # groff's hyphen and minus glyphs
        text = text.replace(dash, "-")
    warnings = proc.stderr.decode("utf-8", "replace").strip()
    if proc.returncode != 0:
        warnings += f"\n(groff exited {proc.returncode})"
    return text, warnings.strip()


def flags_of(help_text):
    """The flags a program's help names, in its option lines (those that start with a dash)."""
    flags = set()
    for line in help_text.splitlines():
        stripped = line.strip()
        if not stripped.startswith("-"):
            continue
        head = re.split(r"\s{2,}", stripped, maxsplit=1)[0]  # "-h,--help", "--port UINT:UINT in [0 - 65535]"
        for part in head.split(","):
            m = FLAG.match(part.strip())
            if m:
                flags.add(m.group(1))
    return flags


def check_page(groff, name, source, help_text):
    """Returns the problems of one page, as lines."""
    problems = []
    text, warnings = render(groff, source)
    if warnings:
        problems.append(f"{name}: groff warns:\n{warnings}")
    for section in REQUIRED_SECTIONS:
        if not re.search(rf"^{re.escape(section)}$", text, re.M):
            problems.append(f"{name}: no {section} section")
    if re.search(r"manual page for", text):
        problems.append(f"{name}: NAME is help2man's default (docs/man/{name}.h2m has no [NAME])")
    flags = flags_of(help_text)
    if not flags:
        problems.append(f"{name}: its help names no flag at all")
    for flag in sorted(flags):
        if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text):
            problems.append(f"{name}: the page does not name {flag}")
    return problems


def self_test(groff):
    help_text = "Options:\n  -h,--help   print this help\n  --port UINT:UINT in [0 - 65535]  TCP port\n"
    good = (".TH T 1\n.SH NAME\nt \\- test\n.SH SYNOPSIS\nt\n.SH DESCRIPTION\n.TP\n\\fB\\-h\\fR, \\fB\\-\\-help\\fR\n"
            "help\n.TP\n\\fB\\-\\-port\\fR UINT\nport\n.SH \"EXIT STATUS\"\n0\n.SH ENVIRONMENT\nnone\n")
    cases = {
        "a good page": (good, False),
        "a page with a groff warning": (good.replace(".SH ENVIRONMENT", ".XX bogus\n.SH ENVIRONMENT"), True),
        "a page missing --port": (good.replace("\\fB\\-\\-port\\fR UINT", "UINT"), True),
        "a page missing EXIT STATUS": (good.replace(".SH \"EXIT STATUS\"\n0\n", ""), True),
    }
    failed = False
    for what, (source, must_fail) in cases.items():
        problems = check_page(groff, "selftest", source, help_text)
        if bool(problems) != must_fail:
            print(f"check_man_pages: self-test: {what}: expected {'problems' if must_fail else 'none'}, got "
                  f"{problems or 'none'}", file=sys.stderr)
            failed = True
    print(f"check_man_pages: self-test {'FAILED' if failed else 'passed'} ({len(cases)} cases)")
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description="Checks spindle's man pages.")
    parser.add_argument("--groff", default="groff")
    parser.add_argument("--page", nargs=3, action="append", default=[], metavar=("PAGE", "PROGRAM", "HELP"))
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test(args.groff)
    if not args.page:
        parser.error("no --page")
    problems = []
    for page, program, help_word in args.page:
        help_option = "--" + help_word
        name = os.path.basename(program)
        try:
            with gzip.open(page, "rt", encoding="utf-8") as f:
                source = f.read()
        except OSError as e:
            problems.append(f"{name}: cannot read {page}: {e}")
            continue
        proc = subprocess.run([program, help_option], capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            problems.append(f"{name}: {help_option} exited {proc.returncode}: {proc.stderr}")
            continue
        page_problems = check_page(args.groff, name, source, proc.stdout)
        problems += page_problems
        print(f"check_man_pages: {name}: {'FAIL' if page_problems else 'ok'} ({len(flags_of(proc.stdout))} flags)")
    for p in problems:
        print(f"check_man_pages: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
