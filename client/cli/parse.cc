#include "client/cli/parse.h"

#include <cstdint>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tessera::cli {
namespace {

// The longest attribute name the server takes (LaunchRequest.attrs keys).
constexpr size_t kMaxAttrNameBytes = 64;

// "3", "-2", "+7" (what absl::SimpleAtoi accepts, without surrounding blanks).
bool IsInteger(absl::string_view text, int64_t* value) {
  return !text.empty() && !absl::ascii_isspace(static_cast<unsigned char>(text.front())) &&
         !absl::ascii_isspace(static_cast<unsigned char>(text.back())) &&
         absl::SimpleAtoi(text, value);
}

// A float literal: digits somewhere, or one of inf/-inf/+inf/infinity/nan.
bool IsFloat(absl::string_view text, double* value) {
  if (text.empty() || absl::ascii_isspace(static_cast<unsigned char>(text.front())) ||
      absl::ascii_isspace(static_cast<unsigned char>(text.back())) ||
      !absl::SimpleAtod(text, value)) {
    return false;
  }
  if (text.find_first_of("0123456789") != absl::string_view::npos) return true;
  absl::string_view word = text;
  if (!absl::ConsumePrefix(&word, "-")) absl::ConsumePrefix(&word, "+");
  return absl::EqualsIgnoreCase(word, "inf") || absl::EqualsIgnoreCase(word, "infinity") ||
         absl::EqualsIgnoreCase(word, "nan");
}

// A sample value of an attribute type, as written on the command line.
std::string Example(absl::string_view type, absl::string_view written) {
  int64_t i = 0;
  double f = 0;
  const bool is_int = IsInteger(written, &i);
  const bool is_number = IsFloat(written, &f);
  if (type == "ints") {
    if (is_int) return absl::StrCat("[", written, "]");
    return "[0,1]";
  }
  if (type == "floats") {
    if (is_number) return absl::StrCat("[", written, "]");
    return "[0.5,1.5]";
  }
  if (type == "int") {
    absl::string_view inner = written;
    if (absl::ConsumePrefix(&inner, "[") && absl::ConsumeSuffix(&inner, "]") &&
        IsInteger(absl::StripAsciiWhitespace(inner), &i)) {
      return std::string(absl::StripAsciiWhitespace(inner));
    }
    return "3";
  }
  if (type == "float") return "0.5";
  if (type == "bool") return "true";
  if (type == "string") {
    return written.empty() ? std::string("text") : absl::StrCat("\"", written, "\"");
  }
  return "";
}

std::string TypeInWords(absl::string_view type) {
  if (type == "ints") return "a list of ints";
  if (type == "floats") return "a list of floats";
  if (type == "int") return "an int";
  if (type == "float") return "a float";
  if (type == "bool") return "true or false";
  if (type == "string") return "a string";
  return std::string(type);
}

// The word of `text` that starts at `at`: up to a blank, ';', ')' or ','.
absl::string_view WordAt(absl::string_view text, size_t at) {
  size_t end = at;
  while (end < text.size() && !absl::ascii_isspace(static_cast<unsigned char>(text[end])) &&
         text[end] != ';' && text[end] != ')' && text[end] != ',') {
    ++end;
  }
  return text.substr(at, end - at);
}

bool IsNameStart(char c) { return absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsNameChar(char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Skips blanks, newlines and '#' comments from `i`, as the kernel language's lexer does.
size_t SkipBlanksAndComments(absl::string_view text, size_t i) {
  while (i < text.size()) {
    if (text[i] == '#') {
      while (i < text.size() && text[i] != '\n') ++i;
    } else if (text[i] == ' ' || text[i] == '\t' || text[i] == '\r' || text[i] == '\n') {
      ++i;
    } else {
      break;
    }
  }
  return i;
}

}  // namespace

absl::StatusOr<absl::Duration> ParseTimeout(absl::string_view text) {
  absl::Duration duration;
  double seconds = 0;
  const absl::string_view s = absl::StripAsciiWhitespace(text);
  if (absl::SimpleAtod(s, &seconds) && s.find_first_of("0123456789") != absl::string_view::npos) {
    duration = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(s, &duration)) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", text, "\" is not a duration; write e.g. 30s, 500ms, 2m, 1h30m or inf"));
  }
  if (duration <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", text, "\" is not a positive duration"));
  }
  return duration;
}

absl::StatusOr<std::map<std::string, std::string>> ParseLabels(
    const std::vector<std::string>& items) {
  std::map<std::string, std::string> labels;
  for (const std::string& item : items) {
    if (item.empty()) continue;
    std::vector<std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (kv.size() != 2 || kv[0].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", item, "\" is not key=value; write e.g. --labels=team=ml,env=dev"));
    }
    if (!labels.emplace(kv[0], kv[1]).second) {
      return absl::InvalidArgumentError(absl::StrCat("label \"", kv[0], "\" is given twice"));
    }
  }
  return labels;
}

absl::StatusOr<v1::Priority> ParsePriority(absl::string_view text) {
  if (text.empty()) return v1::PRIORITY_UNSPECIFIED;
  if (text == "normal") return v1::PRIORITY_NORMAL;
  if (text == "low") return v1::PRIORITY_LOW;
  return absl::InvalidArgumentError(
      absl::StrCat("\"", text, "\" is not a priority; use normal or low"));
}

absl::StatusOr<v1::AttrValue> ParseAttr(absl::string_view text) {
  v1::AttrValue value;
  int64_t i = 0;
  double f = 0;
  if (text == "true" || text == "false") {
    value.set_b(text == "true");
  } else if (IsInteger(text, &i)) {
    value.set_i(i);
  } else if (IsFloat(text, &f)) {
    value.set_f(f);
  } else if (text.size() >= 2 && (text.front() == '"' || text.front() == '\'') &&
             text.back() == text.front()) {
    value.set_s(std::string(text.substr(1, text.size() - 2)));
  } else if (absl::StartsWith(text, "[")) {
    absl::string_view inner = text.substr(1);
    if (!absl::ConsumeSuffix(&inner, "]")) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", text,
                       "\" opens a list without closing it; write e.g. [0,1] (or quote a string "
                       "that starts with [)"));
    }
    std::vector<absl::string_view> items;
    if (!absl::StripAsciiWhitespace(inner).empty()) items = absl::StrSplit(inner, ',');
    bool all_ints = true;
    for (absl::string_view& item : items) {
      item = absl::StripAsciiWhitespace(item);
      if (!IsFloat(item, &f)) {
        return absl::InvalidArgumentError(
            absl::StrCat("list item \"", item, "\" in ", text,
                         " is not a number; lists hold ints ([0,1]) or floats ([0.5,2])"));
      }
      all_ints = all_ints && IsInteger(item, &i);
    }
    if (all_ints) {
      v1::IntList* ints = value.mutable_ints();
      for (absl::string_view item : items) {
        (void)IsInteger(item, &i);
        ints->add_values(i);
      }
    } else {
      v1::FloatList* floats = value.mutable_floats();
      for (absl::string_view item : items) {
        (void)IsFloat(item, &f);
        floats->add_values(f);
      }
    }
  } else {
    value.set_s(std::string(text));
  }
  return value;
}

absl::StatusOr<Attrs> ParseAttrs(const std::vector<std::string>& flags) {
  Attrs attrs;
  for (const std::string& flag : flags) {
    for (absl::string_view item : absl::StrSplit(flag, ';', absl::SkipWhitespace())) {
      std::vector<absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
      const absl::string_view key =
          kv.empty() ? absl::string_view() : absl::StripAsciiWhitespace(kv[0]);
      if (kv.size() != 2 || key.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("\"", absl::StripAsciiWhitespace(item),
                                                       "\" is not k=v; write ", kAttrSyntax));
      }
      if (key.size() > kMaxAttrNameBytes) {
        return absl::InvalidArgumentError(absl::StrCat("attribute name \"", key.substr(0, 16),
                                                       "...\" is ", key.size(),
                                                       " bytes; the limit is ", kMaxAttrNameBytes));
      }
      const absl::string_view written = absl::StripAsciiWhitespace(kv[1]);
      absl::StatusOr<v1::AttrValue> value = ParseAttr(written);
      if (!value.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(key, ": ", value.status().message()));
      }
      if (!attrs.written.emplace(std::string(key), std::string(written)).second) {
        return absl::InvalidArgumentError(absl::StrCat("attribute ", key, " is given twice"));
      }
      attrs.values[std::string(key)] = *std::move(value);
    }
  }
  return attrs;
}

std::string AttrHint(absl::string_view server_message,
                     const std::map<std::string, std::string>& written) {
  // "<kernel> attribute <name> must be <type>; got <type>"
  for (size_t at = server_message.find("attribute "); at != absl::string_view::npos;
       at = server_message.find("attribute ", at + 1)) {
    const absl::string_view name = WordAt(server_message, at + 10);
    absl::string_view rest = server_message.substr(at + 10 + name.size());
    if (name.empty()) continue;
    std::string type;
    if (absl::ConsumePrefix(&rest, " must be ")) {
      type = std::string(WordAt(rest, 0));
    } else if (absl::ConsumePrefix(&rest, " (")) {
      absl::string_view required = WordAt(rest, 0);
      if (!absl::StartsWith(rest.substr(required.size()), ") is required")) continue;
      type = std::string(required);
    } else {
      continue;
    }
    auto it = written.find(std::string(name));
    const std::string as_written = it == written.end() ? "" : it->second;
    const std::string example = Example(type, as_written);
    if (example.empty()) continue;
    return absl::StrCat(name, " is ", TypeInWords(type), ": write --attr='", name, "=", example,
                        "' (`tessera run --help` has the syntax)");
  }
  return "";
}

std::string DefinedName(absl::string_view text) {
  size_t i = SkipBlanksAndComments(text, 0);
  constexpr absl::string_view kKeyword = "kernel";
  if (!absl::StartsWith(text.substr(i), kKeyword)) return "";
  i += kKeyword.size();
  if (i < text.size() && IsNameChar(text[i])) return "";  // "kernels", not "kernel"
  i = SkipBlanksAndComments(text, i);
  if (i >= text.size() || !IsNameStart(text[i])) return "";
  const size_t begin = i;
  while (i < text.size() && IsNameChar(text[i])) ++i;
  return std::string(text.substr(begin, i - begin));
}

}  // namespace tessera::cli
