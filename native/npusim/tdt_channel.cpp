// tdt channels (acl_tdt.h): data items and datasets, and named channels that carry datasets FIFO
// with a capacity. A sent dataset is copied into the channel (its items' data included), so the
// sender may free its own; a received one is copied out into the caller's dataset, whose items
// then own their data. Everything lives in this process: a checkpoint carries it as it is.
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "acl/acl_tdt.h"
#include "resources.h"
#include "runtime.h"

using namespace npusim::rt;

struct acltdtDataItem {
  acltdtTensorType type;
  std::vector<int64_t> dims;
  aclDataType data_type;
  void *data;                  // the caller's, or owned below
  size_t size;
  std::vector<uint8_t> owned;  // data received from a channel
  size_t slice_num = 1, slice_id = 0;
};

struct acltdtDataset {
  std::vector<acltdtDataItem *> items;
  std::vector<std::unique_ptr<acltdtDataItem>> received;  // items a receive created
  std::string name;
};

namespace {

struct Copy {  // a dataset as a channel holds it
  struct Item {
    acltdtTensorType type;
    std::vector<int64_t> dims;
    aclDataType data_type;
    std::vector<uint8_t> data;
  };
  std::vector<Item> items;
  std::string name;
};

struct Channel {
  uint32_t device;
  std::string name;
  size_t capacity;
  std::deque<Copy> queue;
  bool stopped = false;
};

constexpr size_t kDefaultCapacity = 128;  // CANN's channel depth when none is given

struct State {
  std::mutex mu;  // guards channels and every Channel
  std::condition_variable cv;
  std::set<Channel *> channels;
};

State &state() {
  static auto *s = new State;  // never destroyed: a receiver may still wait at exit
  return *s;
}

// Waits (l held) until ready() or the timeout (ms; -1 forever, 0 not at all); false on timeout.
template <typename F>
bool wait_for(std::unique_lock<std::mutex> &l, int32_t timeout, F ready) {
  if (timeout < 0) {
    state().cv.wait(l, ready);
    return true;
  }
  return state().cv.wait_for(l, std::chrono::milliseconds(timeout), ready);
}

Channel *live(const acltdtChannelHandle *handle) {
  auto *c = reinterpret_cast<Channel *>(const_cast<acltdtChannelHandle *>(handle));
  return state().channels.count(c) ? c : nullptr;
}

acltdtChannelHandle *create(uint32_t deviceId, const char *name, size_t capacity) {
  uint32_t count = 0;
  if (name == nullptr || name[0] == '\0' || capacity == 0 || aclrtGetDeviceCount(&count) != ACL_SUCCESS ||
      deviceId >= count) {
    note_error(ACL_ERROR_INVALID_PARAM, "acltdtCreateChannel: bad device, name or capacity (aclInit first)");
    return nullptr;
  }
  std::lock_guard<std::mutex> g(state().mu);
  for (Channel *c : state().channels)
    if (c->name == name && c->device == deviceId) {
      note_error(ACL_ERROR_INVALID_PARAM, std::string("acltdtCreateChannel: a channel ") + name + " exists already");
      return nullptr;
    }
  auto *c = new Channel{deviceId, name, capacity, {}};
  state().channels.insert(c);
  return reinterpret_cast<acltdtChannelHandle *>(c);
}

}  // namespace

extern "C" {

acltdtTensorType acltdtGetTensorTypeFromItem(const acltdtDataItem *dataItem) {
  return dataItem ? dataItem->type : ACL_TENSOR_DATA_UNDEFINED;
}
aclDataType acltdtGetDataTypeFromItem(const acltdtDataItem *dataItem) {
  return dataItem ? dataItem->data_type : ACL_DT_UNDEFINED;
}
void *acltdtGetDataAddrFromItem(const acltdtDataItem *dataItem) { return dataItem ? dataItem->data : nullptr; }
size_t acltdtGetDataSizeFromItem(const acltdtDataItem *dataItem) { return dataItem ? dataItem->size : 0; }
size_t acltdtGetDimNumFromItem(const acltdtDataItem *dataItem) { return dataItem ? dataItem->dims.size() : 0; }

aclError acltdtGetSliceInfoFromItem(const acltdtDataItem *dataItem, size_t *sliceNum, size_t *sliceId) {
  if (dataItem == nullptr || sliceNum == nullptr || sliceId == nullptr)
    return note_error(ACL_ERROR_INVALID_PARAM, "acltdtGetSliceInfoFromItem: NULL argument");
  *sliceNum = dataItem->slice_num;
  *sliceId = dataItem->slice_id;
  return ACL_SUCCESS;
}

aclError acltdtGetDimsFromItem(const acltdtDataItem *dataItem, int64_t *dims, size_t dimNum) {
  if (dataItem == nullptr || (dims == nullptr && dimNum > 0) || dimNum < dataItem->dims.size())
    return note_error(ACL_ERROR_INVALID_PARAM, "acltdtGetDimsFromItem: dims holds fewer than the item's dimensions");
  std::copy(dataItem->dims.begin(), dataItem->dims.end(), dims);
  return ACL_SUCCESS;
}

acltdtDataItem *acltdtCreateDataItem(acltdtTensorType tdtType, const int64_t *dims, size_t dimNum, aclDataType dataType,
                                     void *data, size_t size) {
  if (tdtType < ACL_TENSOR_DATA_TENSOR || tdtType > ACL_TENSOR_DATA_END_TENSOR || (dims == nullptr && dimNum > 0) ||
      (data == nullptr && size > 0)) {
    note_error(ACL_ERROR_INVALID_PARAM, "acltdtCreateDataItem: bad type, dims or data");
    return nullptr;
  }
  return new acltdtDataItem{tdtType, std::vector<int64_t>(dims, dims + dimNum), dataType, data, size, {}};
}

aclError acltdtDestroyDataItem(acltdtDataItem *dataItem) {
  if (dataItem == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtDestroyDataItem: NULL");
  delete dataItem;
  return ACL_SUCCESS;
}

acltdtDataset *acltdtCreateDataset() { return new acltdtDataset; }

aclError acltdtDestroyDataset(acltdtDataset *dataset) {
  if (dataset == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtDestroyDataset: NULL");
  delete dataset;  // items the caller added stay the caller's
  return ACL_SUCCESS;
}

acltdtDataItem *acltdtGetDataItem(const acltdtDataset *dataset, size_t index) {
  return dataset != nullptr && index < dataset->items.size() ? dataset->items[index] : nullptr;
}

aclError acltdtAddDataItem(acltdtDataset *dataset, acltdtDataItem *dataItem) {
  if (dataset == nullptr || dataItem == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtAddDataItem: NULL");
  dataset->items.push_back(dataItem);
  return ACL_SUCCESS;
}

size_t acltdtGetDatasetSize(const acltdtDataset *dataset) { return dataset ? dataset->items.size() : 0; }

const char *acltdtGetDatasetName(const acltdtDataset *dataset) {
  return dataset != nullptr && !dataset->name.empty() ? dataset->name.c_str() : nullptr;
}

acltdtChannelHandle *acltdtCreateChannel(uint32_t deviceId, const char *name) {
  return create(deviceId, name, kDefaultCapacity);
}

acltdtChannelHandle *acltdtCreateChannelWithCapacity(uint32_t deviceId, const char *name, size_t capacity) {
  return create(deviceId, name, capacity);
}

aclError acltdtStopChannel(acltdtChannelHandle *handle) {
  std::lock_guard<std::mutex> g(state().mu);
  Channel *c = live(handle);
  if (c == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtStopChannel: not a live channel");
  c->stopped = true;  // blocked senders and receivers return
  state().cv.notify_all();
  return ACL_SUCCESS;
}

aclError acltdtDestroyChannel(acltdtChannelHandle *handle) {
  std::lock_guard<std::mutex> g(state().mu);
  Channel *c = live(handle);
  if (c == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtDestroyChannel: not a live channel");
  state().channels.erase(c);
  state().cv.notify_all();
  delete c;
  return ACL_SUCCESS;
}

aclError acltdtCleanChannel(acltdtChannelHandle *handle) {
  std::lock_guard<std::mutex> g(state().mu);
  Channel *c = live(handle);
  if (c == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtCleanChannel: not a live channel");
  c->queue.clear();
  state().cv.notify_all();
  return ACL_SUCCESS;
}

aclError acltdtSendTensor(const acltdtChannelHandle *handle, const acltdtDataset *dataset, int32_t timeout) {
  if (dataset == nullptr || timeout < -1) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtSendTensor: bad dataset or timeout");
  Copy copy;
  copy.name = dataset->name;
  for (const acltdtDataItem *item : dataset->items) {
    const auto *bytes = static_cast<const uint8_t *>(item->data);
    copy.items.push_back({item->type, item->dims, item->data_type, std::vector<uint8_t>(bytes, bytes + item->size)});
  }
  std::unique_lock<std::mutex> l(state().mu);
  Channel *c = live(handle);
  if (c == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtSendTensor: not a live channel");
  auto room = [&] { return live(handle) == nullptr || c->stopped || c->queue.size() < c->capacity; };
  if (!wait_for(l, timeout, room)) return note_error(ACL_ERROR_RT_QUEUE_FULL, "acltdtSendTensor: the channel is full");
  if (live(handle) == nullptr || c->stopped) return note_error(ACL_ERROR_FAILURE, "acltdtSendTensor: the channel was stopped");
  c->queue.push_back(std::move(copy));
  state().cv.notify_all();
  return ACL_SUCCESS;
}

aclError acltdtReceiveTensor(const acltdtChannelHandle *handle, acltdtDataset *dataset, int32_t timeout) {
  if (dataset == nullptr || timeout < -1) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtReceiveTensor: bad dataset or timeout");
  std::unique_lock<std::mutex> l(state().mu);
  Channel *c = live(handle);
  if (c == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtReceiveTensor: not a live channel");
  auto some = [&] { return live(handle) == nullptr || c->stopped || !c->queue.empty(); };
  if (!wait_for(l, timeout, some)) return note_error(ACL_ERROR_RT_QUEUE_EMPTY, "acltdtReceiveTensor: the channel is empty");
  if (live(handle) == nullptr || (c->stopped && c->queue.empty()))
    return note_error(ACL_ERROR_FAILURE, "acltdtReceiveTensor: the channel was stopped");
  Copy got = std::move(c->queue.front());
  c->queue.pop_front();
  state().cv.notify_all();
  l.unlock();
  dataset->name = got.name;
  for (Copy::Item &it : got.items) {
    auto item = std::make_unique<acltdtDataItem>(acltdtDataItem{it.type, it.dims, it.data_type, nullptr, it.data.size(),
                                                                std::move(it.data)});
    item->data = item->owned.data();
    dataset->items.push_back(item.get());
    dataset->received.push_back(std::move(item));
  }
  return ACL_SUCCESS;
}

aclError acltdtQueryChannelSize(const acltdtChannelHandle *handle, size_t *size) {
  if (size == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtQueryChannelSize: size is NULL");
  std::lock_guard<std::mutex> g(state().mu);
  Channel *c = live(handle);
  if (c == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtQueryChannelSize: not a live channel");
  *size = c->queue.size();
  return ACL_SUCCESS;
}

}  // extern "C"

// Snapshot kind "tdt_channels": process memory only, so Backup and Restore have nothing to do; it
// is counted so that `npusnap inspect` shows the channels a checkpoint carried.
namespace {

size_t count_channels() {
  std::lock_guard<std::mutex> g(state().mu);
  return state().channels.size();
}

const ResourceKind kChannels{"tdt_channels", 71, nullptr, nullptr, nullptr, nullptr, count_channels};
NPUSIM_RESOURCE_KIND(kChannels);

}  // namespace
