// Unit tests of the names' slots (runtime/fast_slots.h) with the tensor queue: a kept request's name is armed on its
// second ordinary push and submitted through its slot from then on; the slot's operation and an ordinary one of the
// same name refuse each other while in flight; a handle names one operation, is released once, and survives the
// runtime in the handle table; a slot's name that changes its request, is swept, or meets a closed queue goes the
// ordinary way; a process set's name has a slot of its own. Run from unit_tests.cc's main.
#include <string>
#include <vector>

#include "check.h"
#include "runtime/fast_slots.h"
#include "runtime/tensor_queue.h"

using namespace hvdlite;

namespace {

// A caller's kept request for a named allreduce of 4 floats, as the C ABI receives it.
struct Kept {
  std::string name;
  int64_t shape[1] = {4};
  float input[4] = {1, 2, 3, 4};
  float output[4] = {};
  hvdlite_request q{};
  explicit Kept(std::string n) : name(std::move(n)) {
    q.op = HVDLITE_OP_ALLREDUCE;
    q.dtype = static_cast<int32_t>(DType::kFloat32);
    q.reduce_op = static_cast<int32_t>(ReduceOp::kSum);
    q.prescale_factor = q.postscale_factor = 1.0;
    q.name = name.c_str();
    q.ndim = 1;
    q.shape = shape;
    q.input = input;
    q.output = output;
    q.memory = HVDLITE_HOST_MEMORY;
  }
};

// The ordinary way, as Runtime::enqueue fills an entry from the request.
Status push_kept(TensorQueue& queue, Kept& kept) {
  std::vector<TensorEntry*> batch;
  queue.take_spare(batch, 1);
  TensorEntry& e = *batch[0];
  e.request.op = OpType::kAllreduce;
  e.request.dtype = DType::kFloat32;
  e.request.reduce_op = ReduceOp::kSum;
  e.request.shape.assign(kept.shape, kept.shape + 1);
  e.request.shape_key = key_of_shape(e.request.shape);
  e.request.name = kept.name;
  e.request.process_set = kept.q.process_set_id;
  e.input = kept.input;
  e.output = kept.output;
  e.name_slot_home = &kept.q.name_slot;
  e.name_slot = kept.q.name_slot;
  Status status = queue.push(batch);
  queue.recycle(batch);
  return status;
}

std::vector<TensorEntry*> drain(TensorQueue& queue) {
  std::vector<TensorEntry*> out;
  queue.drain(out);
  return out;
}

void finish_all(TensorQueue& queue, const std::vector<TensorEntry*>& entries, const Status& status = Status::Ok()) {
  for (TensorEntry* e : entries) queue.finish(e, status);
}

}  // namespace

void test_fast_slots() {
  FastSlots slots;
  HandleTable table;
  {
    TensorQueue queue(&slots);
    Kept kept("grad.0");
    int64_t handle = 0;
    // First push: the name gets its record and token; second: the caller brings the token back and the slot is
    // armed; neither is taken by the slot.
    CHECK(!queue.submit_fast(&kept.q, 1, &handle));
    CHECK(push_kept(queue, kept).ok() && kept.q.name_slot != 0);
    finish_all(queue, drain(queue));
    CHECK(!queue.submit_fast(&kept.q, 1, &handle));
    CHECK(push_kept(queue, kept).ok());
    // While that ordinary operation is in flight, the slot takes no submission.
    CHECK(!queue.submit_fast(&kept.q, 1, &handle));
    finish_all(queue, drain(queue));

    // Through the slot: a handle of its own kind, nothing queued until the drain claims the slot's entry.
    CHECK(queue.empty());
    CHECK(queue.submit_fast(&kept.q, 1, &handle) && FastSlots::names_slot(handle));
    CHECK(!queue.empty());
    FastSlot* slot = slots.owner(handle);
    CHECK(slot && !slot->outcome.finished());
    // In flight: a second submission is not the slot's, and the ordinary way refuses the name.
    int64_t second = 0;
    CHECK(!queue.submit_fast(&kept.q, 1, &second));
    CHECK(push_kept(queue, kept).code() == StatusCode::kInvalidArgument);
    std::vector<TensorEntry*> claimed = drain(queue);
    CHECK(claimed.size() == 1 && claimed[0] == &slot->entry && claimed[0]->input == kept.input);
    CHECK(claimed[0]->request.name == "grad.0" && claimed[0]->name_record != nullptr);
    CHECK(queue.empty() && drain(queue).empty());
    finish_all(queue, claimed);
    CHECK(slot->outcome.finished() && slot->outcome.status.ok());
    // Finished but not released: the slot waits for its handle's owner; the name is free for the ordinary way.
    CHECK(!queue.submit_fast(&kept.q, 1, &second));
    CHECK(push_kept(queue, kept).ok());
    finish_all(queue, drain(queue));
    CHECK(slots.release(handle) && !slots.owner(handle) && !slots.release(handle));

    // A new operation in the slot has a new handle; a failure stays readable until released.
    CHECK(queue.submit_fast(&kept.q, 1, &second) && second != handle);
    CHECK(!slots.owner(handle) && slots.owner(second) == slot);
    finish_all(queue, drain(queue), Status(StatusCode::kInvalidArgument, "shapes differ"));
    CHECK(slot->outcome.finished() && slot->outcome.status.message() == "shapes differ");
    CHECK(slot->state.load() == FastSlot::kFailed);
    CHECK(slots.release(second));
    // Released before it finished: the slot is idle again once it does.
    CHECK(queue.submit_fast(&kept.q, 1, &handle));
    CHECK(slots.release(handle));
    CHECK(!queue.submit_fast(&kept.q, 1, &second));
    finish_all(queue, drain(queue));
    CHECK(slot->state.load() == FastSlot::kIdle && !slots.owner(handle));

    // A different request under the name (another shape) goes the ordinary way, and is armed for next time.
    CHECK(queue.submit_fast(&kept.q, 1, &handle) && slots.release(handle));
    finish_all(queue, drain(queue));
    kept.shape[0] = 2;
    CHECK(!queue.submit_fast(&kept.q, 1, &handle));
    CHECK(push_kept(queue, kept).ok());
    finish_all(queue, drain(queue));
    CHECK(queue.submit_fast(&kept.q, 1, &handle));
    CHECK(drain(queue)[0]->request.shape == std::vector<int64_t>{2});
    finish_all(queue, {&slot->entry});
    CHECK(slots.release(handle));
    // A batch goes through its slots all or none: with a name not armed, or a name twice, none is taken.
    Kept fresh("grad.fresh");
    CHECK(push_kept(queue, fresh).ok());
    finish_all(queue, drain(queue));
    hvdlite_request batch[2] = {kept.q, fresh.q};
    int64_t handles[2] = {0, 0};
    CHECK(!queue.submit_fast(batch, 2, handles) && slot->state.load() == FastSlot::kIdle);
    CHECK(push_kept(queue, fresh).ok());  // armed now
    finish_all(queue, drain(queue));
    batch[1] = kept.q;
    CHECK(!queue.submit_fast(batch, 2, handles) && slot->state.load() == FastSlot::kIdle);
    batch[1] = fresh.q;
    CHECK(queue.submit_fast(batch, 2, handles) && slots.owner(handles[0]) == slot && slots.owner(handles[1]));
    CHECK(drain(queue).size() == 2);
    finish_all(queue, {&slot->entry, &slots.owner(handles[1])->entry});
    CHECK(slots.release(handles[0]) && slots.release(handles[1]));
    // A token of another name (or none) finds no slot.
    Kept other("grad.1");
    other.q.name_slot = kept.q.name_slot;
    CHECK(!queue.submit_fast(&other.q, 1, &handle));

    // Closed: the slot's submitted operation fails with the queue's status, and nothing more is taken.
    CHECK(queue.submit_fast(&kept.q, 1, &handle));
    queue.close(Status(StatusCode::kAborted, "shut down"));
    CHECK(slot->outcome.finished() && slot->outcome.status.code() == StatusCode::kAborted);
    CHECK(!queue.submit_fast(&kept.q, 1, &second));
    // Unreleased handles move to the table when the runtime goes; the slots are disarmed for the next one.
    slots.retire(table);
    CHECK(!slots.owner(handle));
    std::shared_ptr<HandleState> moved = table.get(handle);
    CHECK(moved && moved->finished() && moved->status.code() == StatusCode::kAborted);
    CHECK(slot->state.load() == FastSlot::kIdle && slot->token.load() == 0);
  }
  {
    // The next runtime's queue: the same token value names another record, and hands out handles of a new epoch.
    TensorQueue queue(&slots);
    Kept kept("grad.other");
    int64_t handle = 0;
    CHECK(push_kept(queue, kept).ok());
    finish_all(queue, drain(queue));
    CHECK(push_kept(queue, kept).ok());
    finish_all(queue, drain(queue));
    CHECK(queue.submit_fast(&kept.q, 1, &handle));
    CHECK(drain(queue)[0]->request.name == "grad.other");
    CHECK(table.get(handle) == nullptr && slots.owner(handle) != nullptr);
    queue.close(Status(StatusCode::kAborted, "shut down"));
    slots.retire(table);
  }
}

void test_fast_slots_swept() {
  // A swept record's slot is disarmed: its old token takes the ordinary way again, which finds the name anew.
  FastSlots slots;
  TensorQueue queue(&slots);
  Kept kept("swept");
  CHECK(push_kept(queue, kept).ok());
  finish_all(queue, drain(queue));
  CHECK(push_kept(queue, kept).ok());
  finish_all(queue, drain(queue));
  const uint64_t token = kept.q.name_slot;
  int64_t handle = 0;
  CHECK(queue.submit_fast(&kept.q, 1, &handle) && slots.release(handle));
  finish_all(queue, drain(queue));
  // Enough other names to sweep the table (names not in flight are forgotten past TensorQueue::kNamesKept).
  for (size_t i = 0; i < TensorQueue::kNamesKept + 8; ++i) {
    Kept filler("filler." + std::to_string(i));
    CHECK(push_kept(queue, filler).ok());
    finish_all(queue, drain(queue));
  }
  CHECK(!queue.submit_fast(&kept.q, 1, &handle));
  CHECK(push_kept(queue, kept).ok() && kept.q.name_slot != token);
  finish_all(queue, drain(queue));
  queue.close(Status(StatusCode::kAborted, "shut down"));
}

void test_fast_slots_process_sets() {
  // A name in another process set is another record, so another slot; a kept request moved to another set is not
  // described by its slot; a set id beyond the slot's field is never armed.
  FastSlots slots;
  TensorQueue queue(&slots);
  Kept in_set("grad.0"), in_world("grad.0"), far("grad.far");
  in_set.q.process_set_id = 3;
  far.q.process_set_id = 40000;
  for (Kept* kept : {&in_set, &in_world, &far}) {
    for (int push = 0; push < 2; ++push) {
      CHECK(push_kept(queue, *kept).ok());
      finish_all(queue, drain(queue));
    }
  }
  CHECK(in_set.q.name_slot != in_world.q.name_slot);
  int64_t handles[2] = {0, 0};
  CHECK(queue.submit_fast(&in_set.q, 1, &handles[0]) && queue.submit_fast(&in_world.q, 1, &handles[1]));
  std::vector<TensorEntry*> claimed = drain(queue);
  CHECK(claimed.size() == 2 && slots.owner(handles[0]) != slots.owner(handles[1]));
  CHECK(slots.owner(handles[0])->entry.request.process_set == 3);
  CHECK(slots.owner(handles[1])->entry.request.process_set == 0);
  finish_all(queue, claimed);
  CHECK(slots.release(handles[0]) && slots.release(handles[1]));
  in_set.q.process_set_id = 4;
  CHECK(!queue.submit_fast(&in_set.q, 1, &handles[0]));
  CHECK(!queue.submit_fast(&far.q, 1, &handles[0]));
  queue.close(Status(StatusCode::kAborted, "shut down"));
}
