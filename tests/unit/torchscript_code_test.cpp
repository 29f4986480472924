// ckpt::find_load_time_code on hand-written code/ records: what LibTorch would run while
// loading (issue 11 item 11), next to what torch.jit.save writes and must stay accepted.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "ckpt/byte_source.h"
#include "ckpt/error.h"
#include "ckpt/torchscript_code.h"
#include "zip_builder.h"

using namespace zip_test;

namespace {

std::vector<ckpt::load_time_code> scan(const std::string& code, uint16_t method = 0) {
  member m{"arch/code/__torch__/net.py", bytes_of(code)};
  m.method = method;
  built b = build({{"arch/data.pkl", bytes_of("\x80\x02N.")}, m});
  ckpt::memory_source src(b.bytes);
  auto a = ckpt::zip::archive::open(src);
  return ckpt::find_load_time_code(*a);
}

// What torch.jit.save wrote for a module with defaults of every printed kind.
const char* const kSaved = R"py(class M(Module):
  __parameters__ = ["w", ]
  __buffers__ = []
  w : Tensor
  training : bool
  _is_full_backward_hook : NoneType
  c : __torch__.Color
  k : Final[int] = 4
  def forward(self: __torch__.M,
    x: Tensor,
    a: float=inf,
    b: float=-inf,
    d: Device=torch.device("cpu"),
    s: str="q\"\'\\ = f()",
    t: Tuple[int, int]=(1, -2),
    e: float=1.0000000000000001e-05,
    l: List[int]=[1, 2],
    o: Optional[int]=None,
    n: float=nan) -> Tensor:
    w = self.w
    y = torch.add(torch.mul(x, w), a)
    z = __torch__.helper(y) == 3
    return y
class Seq(Module):
  __annotations__["0"] = __torch__.torch.nn.modules.linear.Linear
  __annotations__["1"] = Dict[str, List[int]]
class Color(Enum):
  RED = 1
  GREEN = 2
def helper(y: Tensor, q: bool=True) -> int:
  return 3
)py";

}  // namespace

TEST_CASE("torchscript code: what torch.jit.save writes runs nothing on load") {
  CHECK(scan(kSaved).empty());
  CHECK(scan(kSaved, 8).empty());
}

TEST_CASE("torchscript code: __setstate__ is found with its class and record") {
  auto found = scan("class Net(Module):\n  training : bool\n  def __setstate__(self: __torch__.net.Net,\n"
                    "    state: Tuple[int, bool]) -> NoneType:\n    while True:\n      pass\n");
  REQUIRE(found.size() == 1);
  CHECK(found[0].owner == "__torch__.net.Net");
  CHECK(found[0].record == "code/__torch__/net.py");
  CHECK(found[0].what.find("__setstate__") != std::string::npos);
  CHECK(found[0].offset.has_value());
  CHECK(ckpt::describe(found[0]) ==
        "class __torch__.net.Net defines __setstate__, which LibTorch runs for each saved object of the class "
        "(code/__torch__/net.py)");
  // Spelled across a continuation, or inside a deflated record.
  CHECK(scan("class Net(Module):\n  def \\\n __setstate__(self, s: int) -> NoneType:\n    pass\n").size() == 1);
  CHECK(scan("class Net(Object):\n  def __setstate__(self, s: int) -> NoneType:\n    pass\n", 8).size() == 1);
  // Hidden from this lexer in what it takes for a string: still found in the raw text.
  CHECK(scan("class Net(Module):\n  x : str = \"\n  def __setstate__(self) -> None:\n    pass\n").size() >= 1);
}

TEST_CASE("torchscript code: defaults and class values that are expressions are found") {
  auto found = scan("class Net(Module):\n  def forward(self: __torch__.net.Net,\n    x: Tensor,\n"
                    "    n: int=__torch__.net.side()) -> Tensor:\n    return x\n"
                    "def side() -> int:\n  return 3\n");
  REQUIRE(found.size() == 1);
  CHECK(found[0].what.find("__torch__.net.Net.forward: the default of parameter 'n'") != std::string::npos);
  CHECK(found[0].owner == "__torch__.net.Net");
  CHECK(scan("def f(x: int=len(\"a\".ljust(1000000000))) -> int:\n  return x\n").size() == 1);
  CHECK(scan("class NT(NamedTuple):\n  a : int\n  b : int = __torch__.net.side()\n").size() == 1);
  CHECK(scan("class Net(Module):\n  k : Final[int] = 2 ** 100\n").size() == 1);
  CHECK(scan("class Net(Module):\n  __annotations__[\"0\"] = __torch__.net.side()\n").size() == 1);
  CHECK(scan("class Net(Module):\n  def forward(self, x: Tensor, n: int=torch.ones(3)) -> Tensor:\n"
             "    return x\n").size() == 1);
}

TEST_CASE("torchscript code: refusal is errc::unsafe naming the flag") {
  member m{"arch/code/__torch__.py", bytes_of("class A(Module):\n  def __setstate__(self, s: int) -> None:\n    pass\n")};
  built b = build({{"arch/data.pkl", bytes_of("\x80\x02N.")}, m});
  ckpt::memory_source src(b.bytes);
  auto a = ckpt::zip::archive::open(src);
  try {
    ckpt::refuse_load_time_code(*a);
    FAIL("not refused");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == ckpt::errc::unsafe);
    CHECK(e.message().find("class __torch__.A defines __setstate__") != std::string::npos);
    CHECK(e.message().find("--allow-code") != std::string::npos);
  }
}

TEST_CASE("torchscript code: a tensor default is a constant-table reference, not code") {
  // What torch.jit.save writes for `def forward(self, x, k: Tensor = torch.tensor([1., 2.]))`.
  const std::string saved = "class M(Module):\n  def forward(self: __torch__.net.M,\n    x: Tensor,\n"
                            "    k: Tensor=CONSTANTS.c12) -> Tensor:\n    return torch.add(x, k)\n"
                            "def helper(y: Tensor, q: Tensor=CONSTANTS.c0, n: int=2) -> Tensor:\n  return y\n";
  CHECK(scan(saved).empty());
  member m{"arch/code/__torch__/net.py", bytes_of(saved)};
  built b = build({{"arch/data.pkl", bytes_of("\x80\x02N.")}, m});
  ckpt::memory_source src(b.bytes);
  auto a = ckpt::zip::archive::open(src);
  auto defaults = ckpt::find_constant_defaults(*a);
  REQUIRE(defaults.size() == 2);
  CHECK(defaults[0].function == "__torch__.net.M.forward");
  CHECK(defaults[0].parameter == "k");
  CHECK(defaults[0].constant == 12);
  CHECK(defaults[1].function == "__torch__.net.helper");
  CHECK(defaults[1].parameter == "q");
  CHECK(defaults[1].constant == 0);
  // Anything more than the reference itself is still an expression.
  for (const char* bad : {"CONSTANTS.c0.item()", "CONSTANTS.c0.t", "CONSTANTS.x0", "CONSTANTS.c01",
                          "CONSTANTS", "CONSTANTS.c", "f(CONSTANTS.c0)", "x.CONSTANTS.c0"})
    CHECK_MESSAGE(scan(std::string("def f(k: Tensor=") + bad + ") -> Tensor:\n  return k\n").size() == 1, bad);
}
