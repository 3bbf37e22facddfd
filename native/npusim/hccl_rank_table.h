// HcclCommInitClusterInfo's rank table file: CANN's JSON ("version", "server_count",
// "server_list": [{"server_id", ["host_ip",] "device": [{"device_id", "device_ip", "rank_id"}]}]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace npusim::hccl {

struct RankEntry {
  uint32_t rank = 0;
  uint32_t device = 0;
  std::string host;  // the server's host_ip, else its server_id
};

// The ranks of a rank table, sorted by rank id (0..N-1, each once); false with *why if malformed.
bool parse_rank_table(const std::string &text, std::vector<RankEntry> *ranks, std::string *why);

}  // namespace npusim::hccl
