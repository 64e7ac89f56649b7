// common_pch.h and nlohmann/json, for the libraries most of whose files speak JSON (the server
// and ops libraries, engramctl): see common_pch.h for how it is used.
#include <nlohmann/json.hpp>

#include "base/pch/common_pch.h"
