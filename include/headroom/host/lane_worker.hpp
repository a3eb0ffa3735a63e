#pragma once
// host::LaneWorker: the host engine's second lane (ops::Lane::host_threads).
//
// One thread, started with the trainer, runs the kernels of the ops the
// schedule puts on the host-threads lane, in order, while the step goes on
// with the next ones; the trainer waits for a lane op's ticket before the
// first later step that touches its bytes (trainers::join_steps), and for
// every ticket at the end of the micro-batch. A task is a function pointer
// and the op's context copied into a fixed ring: submitting and waiting
// allocate nothing. An exception thrown by a lane kernel is rethrown by the
// next wait.
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>

namespace headroom::host {

template <class Context>
class LaneWorker {
 public:
  using Kernel = void (*)(const Context&);

  LaneWorker() : thread_([this] { run(); }) {}
  LaneWorker(const LaneWorker&) = delete;
  LaneWorker& operator=(const LaneWorker&) = delete;
  ~LaneWorker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  // Queues kernel(context); returns its ticket (1, 2, ...).
  std::uint64_t submit(Kernel kernel, const Context& context) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return submitted_ - done_ < capacity; });
    Task& t = ring_[submitted_ % capacity];
    t.kernel = kernel;
    t.context = context;
    ++submitted_;
    lock.unlock();
    wake_.notify_all();
    return submitted_;
  }
  // Waits until the task with this ticket (and every one before it) has run.
  void wait(std::uint64_t ticket) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return done_ >= ticket; });
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }
  void wait_all() { wait(submitted_); }
  // Waits for every task and forgets an error one of them threw (the
  // caller is already leaving with another).
  void settle() noexcept {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return done_ >= submitted_; });
    error_ = nullptr;
  }
  std::uint64_t submitted() const { return submitted_; }

 private:
  static constexpr std::uint64_t capacity = 64;
  struct Task {
    Kernel kernel = nullptr;
    Context context{};
  };
  Task ring_[capacity]{};
  std::uint64_t submitted_ = 0, done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::mutex mutex_;
  std::condition_variable wake_, done_cv_;
  std::thread thread_;

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return stop_ || done_ < submitted_; });
      if (done_ == submitted_ && stop_) return;
      const Task& t = ring_[done_ % capacity];
      lock.unlock();
      try {
        t.kernel(t.context);
      } catch (...) {
        lock.lock();
        if (!error_) error_ = std::current_exception();
        lock.unlock();
      }
      lock.lock();
      ++done_;
      done_cv_.notify_all();
    }
  }
};

}  // namespace headroom::host
