#include "hccl_rank_table.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <memory>

namespace npusim::hccl {
namespace {

// Just enough JSON for a rank table: objects, arrays, strings (simple escapes), bare scalars.
struct Value {
  enum Kind { kNull, kString, kScalar, kArray, kObject } kind = kNull;
  std::string text;  // string contents or the scalar's spelling
  std::vector<Value> items;
  std::map<std::string, Value> fields;

  const Value *get(const std::string &key) const {
    auto it = fields.find(key);
    return kind == kObject && it != fields.end() ? &it->second : nullptr;
  }
};

class Parser {
 public:
  explicit Parser(const std::string &s) : s_(s) {}

  bool parse(Value *v) {
    if (!value(v, 0)) return false;
    skip();
    return i_ == s_.size();
  }

 private:
  void skip() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool eat(char c) {
    skip();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool string(std::string *out) {
    if (!eat('"')) return false;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c == '\\') {
        if (i_ >= s_.size()) return false;
        c = s_[i_++];
        if (c == 'n') c = '\n';
        else if (c == 't') c = '\t';
        else if (c == 'u') return false;  // not in rank tables
      }
      out->push_back(c);
    }
    return i_ < s_.size() && s_[i_++] == '"';
  }
  bool value(Value *v, int depth) {
    if (depth > 16) return false;
    skip();
    if (i_ >= s_.size()) return false;
    const char c = s_[i_];
    if (c == '"') {
      v->kind = Value::kString;
      return string(&v->text);
    }
    if (c == '[') {
      ++i_;
      v->kind = Value::kArray;
      if (eat(']')) return true;
      do {
        v->items.emplace_back();
        if (!value(&v->items.back(), depth + 1)) return false;
      } while (eat(','));
      return eat(']');
    }
    if (c == '{') {
      ++i_;
      v->kind = Value::kObject;
      if (eat('}')) return true;
      do {
        std::string key;
        if (!string(&key) || !eat(':') || !value(&v->fields[key], depth + 1)) return false;
      } while (eat(','));
      return eat('}');
    }
    v->kind = Value::kScalar;
    while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '.' || s_[i_] == '-' ||
                              s_[i_] == '+'))
      v->text.push_back(s_[i_++]);
    return !v->text.empty();
  }

  const std::string &s_;
  size_t i_ = 0;
};

// A field that rank tables spell as a string of digits (or a bare number).
bool number(const Value *v, uint32_t *out) {
  if (v == nullptr || (v->kind != Value::kString && v->kind != Value::kScalar) || v->text.empty()) return false;
  char *end = nullptr;
  const unsigned long n = std::strtoul(v->text.c_str(), &end, 10);
  if (*end != '\0' || n > 0xffffffffUL) return false;
  *out = static_cast<uint32_t>(n);
  return true;
}

std::string text(const Value *v) { return v != nullptr && v->kind == Value::kString ? v->text : std::string(); }

}  // namespace

bool parse_rank_table(const std::string &json, std::vector<RankEntry> *ranks, std::string *why) {
  Value root;
  if (!Parser(json).parse(&root) || root.kind != Value::kObject) {
    *why = "the rank table is not valid JSON";
    return false;
  }
  const Value *servers = root.get("server_list");
  if (servers == nullptr || servers->kind != Value::kArray || servers->items.empty()) {
    *why = "the rank table has no server_list";
    return false;
  }
  for (const Value &server : servers->items) {
    const Value *devices = server.get("device");
    if (devices == nullptr || devices->kind != Value::kArray) {
      *why = "a server of the rank table has no device list";
      return false;
    }
    std::string host = text(server.get("host_ip"));
    if (host.empty()) host = text(server.get("server_id"));
    for (const Value &d : devices->items) {
      RankEntry e;
      e.host = host;
      if (!number(d.get("rank_id"), &e.rank) || !number(d.get("device_id"), &e.device)) {
        *why = "a device of the rank table lacks a numeric rank_id or device_id";
        return false;
      }
      ranks->push_back(e);
    }
  }
  std::sort(ranks->begin(), ranks->end(), [](const RankEntry &a, const RankEntry &b) { return a.rank < b.rank; });
  for (size_t i = 0; i < ranks->size(); ++i)
    if ((*ranks)[i].rank != i) {
      *why = "the rank table's rank_id values are not 0..N-1, each once";
      return false;
    }
  return true;
}

}  // namespace npusim::hccl
