// MpiCommunicator on 2 and 4 ranks (ctest mpi.communicator.np2 / .np4): every
// call against sums, blocks and bytes computed here, the chunked paths against
// the unchunked ones, agree() and check_size() on every rank.
#include <catch2/catch.hpp>

#include <headroom/host/mpi.hpp>

#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using headroom::DType;
using headroom::host::communication_error;
using headroom::host::Communicator;
using headroom::host::MpiCommunicator;

namespace {

constexpr auto test_timeout = std::chrono::seconds(30);

template <class T>
constexpr DType dtype_of = std::is_same_v<T, float> ? DType::F32 : DType::F64;

// rank r contributes r * 1000 + i at i: the sum is 1000 * (0 + ... + (size-1)) + size * i, exact in f32
template <class T>
void check_all_reduce(Communicator& c, std::int64_t n) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<T>(c.rank() * 1000 + i % 997);
  c.all_reduce_sum(v.data(), n, dtype_of<T>);
  const int p = c.size();
  const T ranks = static_cast<T>(1000 * (p * (p - 1) / 2));
  for (std::int64_t i = 0; i < n; ++i) {
    const T want = ranks + static_cast<T>(p) * static_cast<T>(i % 997);
    if (v[static_cast<std::size_t>(i)] != want) {
      INFO("element " << i << " of " << n);
      REQUIRE(v[static_cast<std::size_t>(i)] == want);
    }
  }
}

// send block b, element i on rank r: (r + 1) * (b * n + i + 1); block `rank` summed over ranks:
// (1 + ... + size) * (rank * n + i + 1)
template <class T>
void check_reduce_scatter(Communicator& c, std::int64_t n) {
  const int p = c.size();
  std::vector<T> send(static_cast<std::size_t>(n * p));
  for (std::int64_t j = 0; j < n * p; ++j) send[static_cast<std::size_t>(j)] = static_cast<T>((c.rank() + 1) * (j + 1));
  std::vector<T> recv(static_cast<std::size_t>(n), T(-1));
  c.reduce_scatter_sum(send.data(), recv.data(), n, dtype_of<T>);
  const T s = static_cast<T>(p * (p + 1) / 2);
  for (std::int64_t i = 0; i < n; ++i) {
    const T want = s * static_cast<T>(c.rank() * n + i + 1);
    if (recv[static_cast<std::size_t>(i)] != want) {
      INFO("element " << i << " of " << n);
      REQUIRE(recv[static_cast<std::size_t>(i)] == want);
    }
  }
}

std::uint8_t gather_byte(int owner, std::int64_t j) { return static_cast<std::uint8_t>((owner * 31 + j * 7 + 1) & 0xff); }

void check_all_gather(Communicator& c, std::int64_t block) {
  const int p = c.size();
  std::vector<std::uint8_t> data(static_cast<std::size_t>(block * p), 0xEE);
  for (std::int64_t j = 0; j < block; ++j) data[static_cast<std::size_t>(c.rank() * block + j)] = gather_byte(c.rank(), j);
  c.all_gather(data.data(), block);
  for (int q = 0; q < p; ++q)
    for (std::int64_t j = 0; j < block; ++j)
      if (data[static_cast<std::size_t>(q * block + j)] != gather_byte(q, j)) {
        INFO("block " << q << ", byte " << j << " of " << block);
        REQUIRE(int(data[static_cast<std::size_t>(q * block + j)]) == int(gather_byte(q, j)));
      }
}

std::uint8_t ring_byte(int from, std::int64_t j, int tag) { return static_cast<std::uint8_t>((from * 13 + j + tag * 5) & 0xff); }

// Each rank sends to the next and receives from the previous; even ranks send first.
void check_ring(Communicator& c, std::int64_t bytes, int tag) {
  const int p = c.size(), r = c.rank();
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  std::vector<std::uint8_t> out(static_cast<std::size_t>(bytes)), in(static_cast<std::size_t>(bytes), 0);
  for (std::int64_t j = 0; j < bytes; ++j) out[static_cast<std::size_t>(j)] = ring_byte(r, j, tag);
  if (r % 2 == 0) {
    c.send(out.data(), bytes, next, tag);
    c.recv(in.data(), bytes, prev, tag);
  } else {
    c.recv(in.data(), bytes, prev, tag);
    c.send(out.data(), bytes, next, tag);
  }
  for (std::int64_t j = 0; j < bytes; ++j)
    if (in[static_cast<std::size_t>(j)] != ring_byte(prev, j, tag)) {
      INFO("byte " << j << " of " << bytes << " from rank " << prev);
      REQUIRE(int(in[static_cast<std::size_t>(j)]) == int(ring_byte(prev, j, tag)));
    }
}

}  // namespace

TEST_CASE("MpiCommunicator: rank, size and the duplicated communicator", "[mpi]") {
  MpiCommunicator c(test_timeout);
  int wrank = -1, wsize = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
  MPI_Comm_size(MPI_COMM_WORLD, &wsize);
  CHECK(c.rank() == wrank);
  CHECK(c.size() == wsize);
  CHECK(c.size() >= 2);
  CHECK(c.who() == "rank " + std::to_string(wrank) + " of " + std::to_string(wsize));
  int cmp = MPI_UNEQUAL;
  MPI_Comm_compare(c.comm(), MPI_COMM_WORLD, &cmp);
  CHECK(cmp == MPI_CONGRUENT);  // a duplicate: same group, its own context
  CHECK(c.timeout() == test_timeout);
  CHECK(c.chunk_limit() == MpiCommunicator::default_chunk_limit);
  CHECK(c.polling().spin_for == std::chrono::milliseconds(1));
  CHECK(c.polling().sleep == std::chrono::microseconds(50));
  CHECK_FALSE(c.failed());
  c.barrier();
}

TEST_CASE("MpiCommunicator: all_reduce_sum, f32 and f64", "[mpi]") {
  MpiCommunicator c(test_timeout);
  for (std::int64_t n : {1, 7, 4096, 1 << 20}) {
    check_all_reduce<float>(c, n);
    check_all_reduce<double>(c, n);
  }
  c.all_reduce_sum(nullptr, 0, DType::F32);  // nothing to do
}

TEST_CASE("MpiCommunicator: reduce_scatter_sum gives each rank the sum of its block", "[mpi]") {
  MpiCommunicator c(test_timeout);
  for (std::int64_t n : {1, 5, 1000, 1 << 18}) {
    check_reduce_scatter<float>(c, n);
    check_reduce_scatter<double>(c, n);
  }
}

TEST_CASE("MpiCommunicator: all_gather in place, bytes", "[mpi]") {
  MpiCommunicator c(test_timeout);
  for (std::int64_t block : {1, 13, 8, 4096, 3 << 20}) check_all_gather(c, block);
}

TEST_CASE("MpiCommunicator: send and recv around a ring", "[mpi]") {
  MpiCommunicator c(test_timeout);
  check_ring(c, 1, 0);
  check_ring(c, 100, 3);
  check_ring(c, 1 << 20, 11);  // above the eager limit: the receiver's recv completes the send
  c.barrier();
}

TEST_CASE("MpiCommunicator: chunked calls give the results of unchunked ones", "[mpi]") {
  MpiCommunicator c(test_timeout);
  c.set_chunk_limit(7);
  CHECK(c.chunk_limit() == 7);
  // all_reduce_sum: chunks of 7 elements, a remainder, and an exact multiple
  for (std::int64_t n : {1, 7, 14, 100, 1003}) {
    check_all_reduce<float>(c, n);
    check_all_reduce<double>(c, n);
  }
  // reduce_scatter_sum and all_gather: size() blocks above the limit go owner by owner, chunk by chunk
  for (std::int64_t n : {1, 3, 7, 20, 201}) {
    check_reduce_scatter<float>(c, n);
    check_reduce_scatter<double>(c, n);
    check_all_gather(c, n);
  }
  // send / recv: byte chunks
  check_ring(c, 7, 1);
  check_ring(c, 1000, 2);
  // a limit that keeps reduce_scatter_sum and all_gather whole below it
  c.set_chunk_limit(256);
  const std::int64_t whole = 256 / c.size();  // size() blocks of this fit one MPI call
  for (std::int64_t n : {whole, whole + 1, std::int64_t{1000}}) {
    check_reduce_scatter<float>(c, n);
    check_all_gather(c, n);
  }

  // the same data through the default limit, once more, element for element
  std::vector<double> a(2345), b;
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<double>((i * 7919 + static_cast<std::size_t>(c.rank())) % 1013);
  b = a;
  c.set_chunk_limit(MpiCommunicator::default_chunk_limit);
  c.all_reduce_sum(a.data(), static_cast<std::int64_t>(a.size()), DType::F64);
  c.set_chunk_limit(100);
  c.all_reduce_sum(b.data(), static_cast<std::int64_t>(b.size()), DType::F64);
  CHECK(a == b);

  CHECK_THROWS_AS(c.set_chunk_limit(0), std::invalid_argument);
}

TEST_CASE("MpiCommunicator: calls from a second thread", "[mpi]") {
  // The engine issues collectives from its communication lane thread.
  MpiCommunicator c(test_timeout);
  std::thread lane([&] {
    check_all_reduce<float>(c, 4096);
    check_reduce_scatter<float>(c, 100);
    check_all_gather(c, 100);
  });
  lane.join();
  check_all_reduce<double>(c, 10);
}

TEST_CASE("MpiCommunicator: agree returns the value when every rank passes it", "[mpi]") {
  MpiCommunicator c(test_timeout);
  CHECK(c.agree(0x1234abcdu) == 0x1234abcdu);
  CHECK(c.agree(0, "the plan") == 0);
  c.barrier();
}

TEST_CASE("MpiCommunicator: agree throws on every rank when one rank differs", "[mpi]") {
  MpiCommunicator c(test_timeout);
  const std::uint64_t mine = c.rank() == 1 ? 0xbadu : 0xc0ffeeu;
  std::string others = "0x0000000000c0ffee on rank";
  if (c.size() == 2) others += " 0";
  else {
    others += "s 0";
    for (int r = 2; r < c.size(); ++r) others += ", " + std::to_string(r);
  }
  const std::string want = c.who() + ": the ranks disagree on the run type's hash: " + others +
                           "; 0x0000000000000bad on rank 1 (were all ranks built from the same program?)";
  CHECK_THROWS_MATCHES(c.agree(mine), communication_error, Catch::Matchers::Message(want));
  // nothing is left in flight: the communicator still works
  CHECK_FALSE(c.failed());
  check_all_reduce<float>(c, 16);
}

TEST_CASE("MpiCommunicator: check_size throws on every rank when the job has another size", "[mpi]") {
  MpiCommunicator c(test_timeout);
  CHECK_NOTHROW(c.check_size(c.size(), "data-parallel ranks"));
  const int p = c.size();
  const std::string want = c.who() + ": the run type says " + std::to_string(p + 1) +
                           " data-parallel ranks, but the launcher started " + std::to_string(p) + " processes (mpirun -np " +
                           std::to_string(p) + ")";
  CHECK_THROWS_MATCHES(c.check_size(p + 1, "data-parallel ranks"), communication_error, Catch::Matchers::Message(want));
  c.barrier();
}

TEST_CASE("MpiCommunicator: arguments wrong on their face throw before anything is sent", "[mpi]") {
  MpiCommunicator c(test_timeout);
  float x = 0;
  CHECK_THROWS_AS(c.all_reduce_sum(&x, -1, DType::F32), std::invalid_argument);
  CHECK_THROWS_AS(c.all_reduce_sum(&x, 1, DType::BF16), std::invalid_argument);
  CHECK_THROWS_AS(c.reduce_scatter_sum(&x, &x, 1, DType::I32), std::invalid_argument);
  CHECK_THROWS_AS(c.all_gather(&x, -4), std::invalid_argument);
  CHECK_THROWS_AS(c.send(&x, 4, c.rank(), 0), std::invalid_argument);  // to itself
  CHECK_THROWS_AS(c.send(&x, 4, c.size(), 0), std::invalid_argument);
  CHECK_THROWS_AS(c.recv(&x, 4, -1, 0), std::invalid_argument);
  CHECK_THROWS_AS(c.recv(&x, 4, (c.rank() + 1) % c.size(), -2), std::invalid_argument);
  CHECK_FALSE(c.failed());
  c.barrier();
}

TEST_CASE("MpiCommunicator: a message of the wrong size is a communication_error", "[mpi]") {
  // Ranks 0 and 1 disagree on sizes: an MPI error code (MPI_ERR_TRUNCATE), then a short message.
  MpiCommunicator c(test_timeout);
  std::vector<char> buf(100, 'x');
  if (c.rank() == 0) {
    c.send(buf.data(), 100, 1, 9);
  } else if (c.rank() == 1) {
    try {
      c.recv(buf.data(), 50, 0, 9);
      FAIL("a 100-byte message into a 50-byte recv did not throw");
    } catch (const communication_error& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(what.rfind("rank 1 of " + std::to_string(c.size()) + ": recv of 50 bytes from rank 0 (tag 9) failed: MPI_Test: ", 0) == 0);
      CHECK(what.find("MPI_ERR_TRUNCATE") != std::string::npos);
    }
    CHECK(c.failed());
    CHECK_THROWS_WITH(c.barrier(), Catch::Matchers::Contains("barrier refused: this communicator failed earlier (recv of 50"));
  }
  MpiCommunicator d(test_timeout);
  if (d.rank() == 0) {
    d.send(buf.data(), 50, 1, 10);
  } else if (d.rank() == 1) {
    CHECK_THROWS_WITH(d.recv(buf.data(), 100, 0, 10),
                      "rank 1 of " + std::to_string(d.size()) +
                          ": recv of 100 bytes from rank 0 (tag 10) received 50 bytes where 100 were expected; the ranks "
                          "disagree on the message size");
  }
}
