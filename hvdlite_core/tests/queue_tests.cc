// Unit tests of an operation's bookkeeping: the tensor queue's name records (a name in flight is refused again, on
// its own or within a group, and stays refused when the records of finished names are swept; a caller's kept
// request finds its record by the token the queue gave it) and the handle table's ids, in its window and apart. Run
// from unit_tests.cc's main (tests/test_core_cpp.py builds the files into one binary).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "runtime/handle_table.h"
#include "runtime/tensor_queue.h"

using namespace hvdlite;

namespace {

// slot: the caller's kept token for the name (hvdlite_request.name_slot), read and updated as the runtime does.
Status push_one(TensorQueue& queue, const std::string& name, int32_t process_set = 0, uint64_t* slot = nullptr) {
  std::vector<TensorEntry*> batch;
  queue.take_spare(batch, 1);
  batch[0]->request.name = name;
  batch[0]->request.process_set = process_set;
  batch[0]->name_slot = slot ? *slot : 0;
  batch[0]->name_slot_home = slot;
  Status status = queue.push(batch);
  queue.recycle(batch);  // refused: still ours
  return status;
}

// Pushes, drains and finishes one operation under name; returns the record it had.
const NameRecord* run_through(TensorQueue& queue, const std::string& name, uint64_t* slot = nullptr) {
  CHECK(push_one(queue, name, 0, slot).ok());
  std::vector<TensorEntry*> drained;
  queue.drain(drained);
  CHECK(drained.size() == 1);
  const NameRecord* record = drained[0]->name_record;
  for (TensorEntry* entry : drained) queue.finish(entry, Status::Ok());
  return record;
}

}  // namespace

void test_name_records() {
  TensorQueue queue;
  CHECK(push_one(queue, "kept").ok());
  std::vector<TensorEntry*> held;
  queue.drain(held);
  CHECK(held.size() == 1 && held[0]->name_record && held[0]->name_record->in_flight);
  CHECK(!push_one(queue, "kept").ok());    // in flight
  CHECK(push_one(queue, "kept", 1).ok());  // the same name in another process set is another tensor
  std::vector<TensorEntry*> other;
  queue.drain(other);

  // The core names unnamed operations "<op>.noname.<n>" and keeps no record of them: a user's name of that form
  // for that operation is refused; an unnamed one is named and queued without a record.
  CHECK(push_one(queue, "allreduce.noname.3").code() == StatusCode::kInvalidArgument);
  CHECK(push_one(queue, "allreduce.noname.").ok() && push_one(queue, "broadcast.noname.3").ok());
  // They are numbered per process set and operation, and one that finished unqueued (the steady lane) takes its
  // number all the same.
  auto push_unnamed = [&](OpType op, int32_t process_set) {
    std::vector<TensorEntry*> one;
    queue.take_spare(one, 1);
    one[0]->request.name.clear();
    one[0]->request.op = op;
    one[0]->request.process_set = process_set;
    CHECK(queue.push(one).ok());
  };
  push_unnamed(OpType::kAllreduce, 0);
  queue.skip_unnamed(0, OpType::kAllreduce);
  push_unnamed(OpType::kAllreduce, 1);
  push_unnamed(OpType::kBroadcast, 0);
  push_unnamed(OpType::kAllreduce, 0);
  std::vector<TensorEntry*> unnamed;
  queue.drain(unnamed);
  CHECK(unnamed.size() == 6 && !unnamed[2]->name_record);
  CHECK(unnamed[2]->request.name == "allreduce.noname.0" && unnamed[3]->request.name == "allreduce.noname.0");
  CHECK(unnamed[4]->request.name == "broadcast.noname.0" && unnamed[5]->request.name == "allreduce.noname.2");

  // A group repeating a name is refused whole, and leaves nothing in flight behind.
  std::vector<TensorEntry*> group;
  queue.take_spare(group, 2);
  group[0]->request.name = group[1]->request.name = "g";
  CHECK(!queue.push(group).ok() && group.size() == 2);
  queue.recycle(group);
  run_through(queue, "g");
  // Again with a name the queue has a record of, which is checked by the record's mark rather than a set: refused
  // whole, and the same group naming it once is accepted.
  group.clear();
  queue.take_spare(group, 3);
  group[0]->request.name = group[2]->request.name = "g";
  group[1]->request.name = "h";
  CHECK(!queue.push(group).ok() && group.size() == 3);
  CHECK(!queue.push(group).ok() && group.size() == 3);
  group[2]->request.name = "i";
  CHECK(queue.push(group).ok() && group.empty());
  std::vector<TensorEntry*> grouped;
  queue.drain(grouped);
  CHECK(grouped.size() == 3);
  for (TensorEntry* entry : grouped) queue.finish(entry, Status::Ok());

  // Many more names than the sweep threshold, each used once (as unnamed operations are): the records of
  // finished names are swept, the one still in flight is kept and still refuses a duplicate.
  for (size_t i = 0; i < 2 * TensorQueue::kNamesKept + 8; ++i) run_through(queue, "once." + std::to_string(i));
  CHECK(held[0]->name_record->in_flight);
  CHECK(!push_one(queue, "kept").ok());
  run_through(queue, "once.7");  // a swept name is accepted again

  // Finished entries come back for reuse, reset.
  TensorEntry* finished = held[0];
  queue.finish(held[0], Status::Ok());
  std::vector<TensorEntry*> reused;
  queue.take_spare(reused, 1);
  CHECK(reused[0] == finished && reused[0]->request.name.empty() && !reused[0]->name_record && !reused[0]->handle);
  queue.recycle(reused);
  run_through(queue, "kept");  // finished: the name may be used again
  queue.finish(other[0], Status::Ok());
}

void test_name_slots() {
  TensorQueue queue;
  // The first push gives the caller a token; handed back, it finds the same record, and the token stays as it was.
  uint64_t grad = 0, other = 0;
  const NameRecord* first = run_through(queue, "grad", &grad);
  CHECK(grad != 0);
  const uint64_t given = grad;
  CHECK(run_through(queue, "grad", &grad) == first && grad == given);
  // A name in flight is refused through its token as through its name.
  CHECK(push_one(queue, "grad", 0, &grad).ok());
  std::vector<TensorEntry*> held;
  queue.drain(held);
  CHECK(!push_one(queue, "grad", 0, &grad).ok() && !push_one(queue, "grad").ok());
  queue.finish(held[0], Status::Ok());
  // A token handed back with another name (a caller that renamed its request) is not that name's: the other
  // name gets a record and a token of its own.
  other = grad;
  const NameRecord* renamed = run_through(queue, "weights", &other);
  CHECK(renamed != first && other != grad);
  // Swept records are reused for new names under a new generation: an old token then finds nothing, and its
  // name gets a record again, with a new token.
  for (size_t i = 0; i < 2 * TensorQueue::kNamesKept + 8; ++i) run_through(queue, "once." + std::to_string(i));
  const uint64_t stale = grad;
  const NameRecord* again = run_through(queue, "grad", &grad);
  CHECK(again && grad != stale && grad != 0);
  CHECK(push_one(queue, "grad", 0, &grad).ok());  // and the new token holds the name in flight
  held.clear();
  queue.drain(held);
  uint64_t copy = stale;
  CHECK(!push_one(queue, "grad", 0, &copy).ok());  // the stale token, looked up by name, finds it in flight too
  queue.finish(held[0], Status::Ok());
}

void test_handle_table() {
  HandleTable table;
  auto a = std::make_shared<HandleState>(), b = std::make_shared<HandleState>();
  const int64_t ia = table.add(a), ib = table.add(b);
  CHECK(ia > 0 && ib > 0 && ia != ib);
  CHECK(table.get(ia) == a && table.get(ib) == b);
  CHECK(!table.get(0) && !table.get(-1) && !table.get(ia + (int64_t{1} << 40)) && !table.get(ib + 1000));
  table.release(ia);
  CHECK(!table.get(ia) && table.get(ib) == b);
  table.release(ia);  // twice: nothing
  // The released slot is reused under another id; the old id still finds nothing.
  auto c = std::make_shared<HandleState>();
  const int64_t ic = table.add(c);
  CHECK(ic > 0 && ic != ia && ic != ib && table.get(ic) == c && !table.get(ia));
  std::vector<std::shared_ptr<HandleState>> many(100, a);
  std::vector<int64_t> ids(many.size());
  table.add_many(many, ids.data());
  std::vector<int64_t> sorted(ids);
  std::sort(sorted.begin(), sorted.end());
  CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end() && sorted.front() > 0);
  table.release_many(ids.data(), static_cast<int32_t>(ids.size()));
  CHECK(!table.get(ids[0]) && !table.get(ids[99]) && table.get(ib) == b && table.get(ic) == c);
  // Ids never repeat, however often slots are reused.
  std::vector<int64_t> seen;
  for (int i = 0; i < 1000; ++i) {
    seen.push_back(table.add(a));
    table.release(seen.back());
  }
  std::sort(seen.begin(), seen.end());
  CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end());

  // A handle held while many later ones come and go leaves the window for the map, and is still found there; the
  // window itself stays within its bound, and ids found in it after it grew are the right ones.
  HandleTable windowed(64);
  auto held = std::make_shared<HandleState>();
  const int64_t kept = windowed.add(held);
  std::vector<int64_t> live;
  std::vector<std::shared_ptr<HandleState>> states;
  for (int i = 0; i < 50; ++i) {
    states.push_back(std::make_shared<HandleState>());
    live.push_back(windowed.add(states.back()));
  }
  for (size_t i = 0; i < live.size(); ++i) CHECK(windowed.get(live[i]) == states[i]);
  CHECK(windowed.held_apart() == 0);
  for (int64_t id : live) windowed.release(id);
  for (int i = 0; i < 1000; ++i) windowed.release(windowed.add(a));
  CHECK(windowed.held_apart() == 1 && windowed.get(kept) == held);
  // Released out of order: the later ones are found until released, the earlier one is gone.
  const int64_t first = windowed.add(a), second = windowed.add(b);
  windowed.release(second);
  CHECK(windowed.get(first) == a && !windowed.get(second));
  windowed.release(first);
  windowed.release(kept);
  CHECK(windowed.held_apart() == 0 && !windowed.get(kept) && !windowed.get(first));
}
