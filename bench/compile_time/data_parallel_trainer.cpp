// Compile-time benchmark input: the host trainer of one data-parallel rank
// (tiny_llama, 2 ranks, ZeRO 3, 4 micro-batches): its plan and schedule,
// and what the trainer derives from them at compile time, among which the
// step each collective on the communication lane must finish before.
#include <headroom/headroom.hpp>
#include <headroom/train/host/trainer.hpp>
using namespace headroom;
using BenchRun = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, Accumulate<4>, DataParallel<2>, ZeRO<3>>;
int train(host::Communicator& ranks) {
  host::Trainer<BenchRun> t({}, ranks);
  return t.steps_done();
}
int main() { return 0; }
