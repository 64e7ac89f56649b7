// json_pch.h and CLI11, which nearly every engramctl file includes: precompiled once for the
// program (base/pch/common_pch.h says how and why).
#include <CLI/CLI.hpp>

#include "base/pch/json_pch.h"
