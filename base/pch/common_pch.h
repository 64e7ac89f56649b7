// The headers nearly every file of the larger libraries includes (the standard containers and
// Abseil's Status, through its own headers): precompiled once per library that names this file
// as its cpp_pch, instead of parsed again by each of its files. Nothing includes this file; meson
// hands it to the compiler. Each source still includes what it uses: a forgotten include
// compiles here but fails in a build without precompiled headers (-Db_pch=false; the libFuzzer
// build of the table sources, tests/table, is one).
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>
