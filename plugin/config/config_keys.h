// Config's keys, for config.cc's parser and validator: one table, so a key
// is added in one place (its parser, range and printer together).
// Internal to plugin/config.
#pragma once

#include <string>

#include "ftrun/status.h"
#include "plugin/config/config.h"

namespace ftrun {
namespace config_keys {

// One known key. `set` parses the scalar into the field (its error says what
// was expected); it is nullptr for the one map-valued key,
// cluster.redundancy, which config.cc reads itself. `check` (optional)
// returns nullptr when the field's value is in range, else what was
// expected; `show` prints the value for ValidateConfig, which has no text to
// quote.
struct Key {
  const char* section;
  const char* name;
  const char* what;  // for "expected <what>, got a map"
  Status (*set)(const std::string& text, Config* c);
  const char* (*check)(const Config& c);
  std::string (*show)(const Config& c);
};

// Every key, in the order the docs list them: `for (const Key& k : Keys())`.
struct Keys {
  static const Key* begin();
  static const Key* end();
};

// The key `name` of `section`, or nullptr.
const Key* FindKey(const std::string& section, const std::string& name);
bool IsSection(const std::string& name);
// "job, store, ...", and a section's keys, for error messages.
std::string SectionList();
std::string KnownKeys(const std::string& section);
std::string Quote(const std::string& s);
// A decimal int, the whole text; else "expected <what>, got '<text>'".
Status ParseInt(const std::string& text, const char* what, int* out);

}  // namespace config_keys
}  // namespace ftrun
