// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Fault points moved to base/inject.h so that numa/ (which may not include uring/) can have
/// some too; this header stays so every existing include keeps working.
#include "base/inject.h"
