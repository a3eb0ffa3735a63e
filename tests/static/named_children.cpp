// Named<"name", L> names a child of Sequential: its node, and so its report
// and parameter paths, read `up`, not its position.
#include <headroom/headroom.hpp>

#include <string_view>

namespace {
using namespace headroom;

using Ffn = Sequential<Named<"norm", RMSNorm<16>>, Named<"up", Linear<16, 32>>, Linear<32, 16>>;
struct Net : Sequential<Embedding<64, 16>, Residual<Ffn>, LMHeadLoss<64, 16, false>> {};
constexpr auto p = plan<Train<Net, Batch<1>, Seq<8>>>();

constexpr int node_named(std::string_view name) {
  for (int n = 0; n < static_cast<int>(p.nodes.size()); ++n)
    if (p.nodes[n].name == name) return n;
  return -1;
}
constexpr int param_of_kind(std::string_view kind) {
  for (int i = 0; i < static_cast<int>(p.params.size()); ++i)
    if (p.nodes[p.params[i].node].kind == kind) return i;
  return -1;
}

static_assert(node_named("up") > 0 && p.nodes[node_named("up")].kind == "Linear");
static_assert(node_named("norm") > 0 && p.nodes[node_named("norm")].kind == "RMSNorm");
static_assert(p.nodes[node_named("up")].index < 0, "a named child is found by its name, not its position");
static_assert(p.params[param_of_kind("RMSNorm")].node == node_named("norm"));
// the unnamed third child keeps its position
static_assert([] {
  for (const auto& n : p.nodes)
    if (n.kind == "Linear" && n.index == 2) return true;
  return false;
}());
static_assert(std::is_same_v<ops_of<Ffn>, type_list<op_entry<Named<"norm", RMSNorm<16>>, ops::RMSNorm>,
                                                    op_entry<Named<"up", Linear<16, 32>>, ops::Linear>>>);
}  // namespace
