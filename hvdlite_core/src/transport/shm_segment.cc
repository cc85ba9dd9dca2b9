#include "transport/shm_segment.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <new>

#include "common/status.h"

namespace hvdlite {
namespace {
constexpr uint64_t kMagic = 0x6876646c69746531ull;  // "hvdlite1"

size_t slot_stride(size_t ring_bytes) { return sizeof(RingHeader) + ((ring_bytes + 63) / 64) * 64; }
size_t total_bytes(int slots, size_t ring_bytes) { return sizeof(InboxHeader) + slots * slot_stride(ring_bytes); }

void* map_shared(int fd, size_t bytes, const std::string& name) {
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) throw Error(StatusCode::kInternal, "mmap of " + name + " failed: " + strerror(errno));
  return base;
}
}  // namespace

std::string ShmInbox::Name(const std::string& job_id, int rank) {
  return "/hvdlite-" + job_id + "-" + std::to_string(rank);
}

static uint64_t pid_namespace() {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

int ShmInbox::RemoveOrphans() {
  const uint64_t mine = pid_namespace();
  DIR* dir = mine ? opendir("/dev/shm") : nullptr;  // where glibc's shm_open keeps its names on Linux
  if (!dir) return 0;
  int removed = 0;
  while (const dirent* entry = readdir(dir)) {
    if (std::strncmp(entry->d_name, "hvdlite-", 8) != 0) continue;
    const std::string name = std::string("/") + entry->d_name;
    const int fd = shm_open(name.c_str(), O_RDONLY, 0);
    if (fd < 0) continue;
    InboxHeader header;
    const bool whole = ::pread(fd, &header, sizeof(header), 0) == static_cast<ssize_t>(sizeof(header));
    ::close(fd);
    // Only an inbox fully made (the magic is written last) by a process of this pid namespace that is gone: a
    // pid read in another namespace could name a live process there, or none.
    if (whole && header.magic == kMagic && header.creator_pid_namespace == mine && header.creator_pid > 0 &&
        kill(header.creator_pid, 0) != 0 && errno == ESRCH && shm_unlink(name.c_str()) == 0) {
      ++removed;
    }
  }
  closedir(dir);
  return removed;
}

ShmInbox ShmInbox::Create(const std::string& name, int owner_rank, int slots, size_t ring_bytes) {
  RemoveOrphans();
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 && errno == EEXIST) {  // a stale segment of a crashed job with the same id
    shm_unlink(name.c_str());
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  }
  if (fd < 0) throw Error(StatusCode::kInternal, "shm_open(" + name + ") failed: " + strerror(errno));
  size_t bytes = total_bytes(slots, ring_bytes);
  // ftruncate alone only sets the size: tmpfs would find out it is full when a peer first writes a page, and
  // deliver SIGBUS. posix_fallocate takes the pages now, so a small /dev/shm is an error here, at init.
  int err = ftruncate(fd, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
  if (err == 0) {
    do {
      err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    } while (err == EINTR);
    if (err == EOPNOTSUPP || err == EINVAL) err = 0;  // a file system that cannot reserve: ftruncate has to do
  }
  if (err != 0) {
    ::close(fd);
    shm_unlink(name.c_str());
    throw ShmSpaceError(bytes, "cannot reserve " + std::to_string(bytes) + " bytes of shared memory for " + name +
                                   ": " + strerror(err));
  }
  ShmInbox inbox;
  inbox.base_ = map_shared(fd, bytes, name);
  inbox.mapped_bytes_ = bytes;
  inbox.name_ = name;
  inbox.owner_ = true;
  void* base = inbox.base_;
  InboxHeader* header = new (base) InboxHeader();
  header->owner_rank = owner_rank;
  header->creator_pid = static_cast<int32_t>(getpid());
  header->creator_pid_namespace = pid_namespace();
  header->slots = slots;
  header->ring_bytes = ring_bytes;
  header->doorbell.store(0);
  header->sleepers.store(0);
  for (int i = 0; i < slots; ++i) {
    RingHeader* ring = new (inbox.ring(i)) RingHeader();
    ring->head.store(0);
    ring->tail.store(0);
    for (MailSlot& slot : ring->mail) slot.seq.store(0);
    ring->mail_taken.store(0);
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  header->magic = kMagic;  // written last: a mapped inbox with the magic is fully initialised
  return inbox;
}

ShmInbox ShmInbox::Open(const std::string& name, int expected_owner) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) throw Error(StatusCode::kInternal, "cannot open peer shared memory " + name + ": " + strerror(errno));
  struct stat st;
  fstat(fd, &st);
  size_t bytes = static_cast<size_t>(st.st_size);
  ShmInbox inbox;
  inbox.base_ = map_shared(fd, bytes, name);
  inbox.mapped_bytes_ = bytes;
  inbox.name_ = name;
  InboxHeader* header = inbox.header();
  if (bytes < sizeof(InboxHeader) || header->magic != kMagic || header->owner_rank != expected_owner ||
      total_bytes(header->slots, header->ring_bytes) != bytes) {
    throw Error(StatusCode::kInternal,
                "shared memory " + name + " is not rank " + std::to_string(expected_owner) + "'s inbox of this job");
  }
  return inbox;
}

ShmInbox::ShmInbox(ShmInbox&& other) noexcept { *this = std::move(other); }

ShmInbox& ShmInbox::operator=(ShmInbox&& other) noexcept {
  std::swap(base_, other.base_);
  std::swap(mapped_bytes_, other.mapped_bytes_);
  std::swap(name_, other.name_);
  std::swap(owner_, other.owner_);
  return *this;
}

ShmInbox::~ShmInbox() {
  if (owner_) unlink();
  if (base_) munmap(base_, mapped_bytes_);
}

RingHeader* ShmInbox::ring(int slot) const {
  char* first = static_cast<char*>(base_) + sizeof(InboxHeader);
  return reinterpret_cast<RingHeader*>(first + slot * slot_stride(header()->ring_bytes));
}

void ShmInbox::unlink() {
  if (owner_) {
    shm_unlink(name_.c_str());
    owner_ = false;
  }
}

}  // namespace hvdlite
