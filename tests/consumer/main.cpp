// SPDX-License-Identifier: Apache-2.0
// The consumer as a program (scripts/consumer-check): exit status 0 when run.cpp's checks pass, else 1.
extern "C" int spindle_consumer_run();

int main() { return spindle_consumer_run(); }
