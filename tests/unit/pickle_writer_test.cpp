// ckpt::pickle::write: byte-for-byte agreement with CPython's protocol-2 pickler on inputs
// CPython wrote (the hex below is pickle.dumps(obj, 2) from CPython 3.11), sharing and
// cycles through the memo, and the spellings protocol 2 lacks. The Python differential test
// loads our output in CPython for a much wider corpus.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ckpt/error.h"
#include "ckpt/pickle.h"
#include "ckpt/pickle_writer.h"
#include "pickle/pickle_opcodes.h"

using ckpt::errc;
using namespace ckpt::pickle;

namespace {

std::vector<uint8_t> unhex(std::string_view hex) {
  std::vector<uint8_t> out;
  auto nib = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(uint8_t(nib(hex[i]) * 16 + nib(hex[i + 1])));
  return out;
}

document parse_bytes(const std::vector<uint8_t>& b) { return parse(b.data(), b.size()); }

// Builds trees by hand, the way a converter would before writing.
struct tree {
  document doc;
  value* make(kind k) { return doc.make(k, 0); }
  value* integer(int64_t i) {
    value* v = make(kind::integer);
    v->integer = i;
    return v;
  }
  value* str(std::string s) {
    value* v = make(kind::str);
    v->text = std::move(s);
    return v;
  }
  value* list(std::vector<value*> items = {}) {
    value* v = make(kind::list);
    v->items = std::move(items);
    return v;
  }
  value* tuple(std::vector<value*> items = {}) {
    value* v = make(kind::tuple);
    v->items = std::move(items);
    return v;
  }
  value* global(std::string m, std::string n) {
    value* v = make(kind::global);
    v->items = {str(std::move(m)), str(std::move(n))};
    return v;
  }
  value* object(object_op op, value* callable, value* args) {
    value* v = make(kind::object);
    v->op = op;
    v->items.assign(kObjectSlots, nullptr);
    v->items[kCallable] = callable;
    v->items[kArgs] = args;
    return v;
  }
};

// The opcodes of a stream the writer made (walking operands of the opcodes it emits).
std::vector<uint8_t> opcodes(const std::vector<uint8_t>& b) {
  std::vector<uint8_t> ops;
  auto u32 = [&](size_t at) {
    return uint32_t(b[at]) | uint32_t(b[at + 1]) << 8 | uint32_t(b[at + 2]) << 16 |
           uint32_t(b[at + 3]) << 24;
  };
  for (size_t i = 0; i < b.size();) {
    uint8_t c = b[i++];
    ops.push_back(c);
    switch (c) {
      case op::PROTO: case op::BININT1: case op::BINPUT: case op::BINGET: i += 1; break;
      case op::BININT2: i += 2; break;
      case op::BININT: case op::LONG_BINPUT: case op::LONG_BINGET: i += 4; break;
      case op::BINFLOAT: i += 8; break;
      case op::LONG1: i += 1 + b[i]; break;
      case op::LONG4: case op::BINUNICODE: i += 4 + u32(i); break;
      case op::GLOBAL:
        for (int line = 0; line < 2; ++line)
          while (b[i++] != '\n') {
          }
        break;
      default: break;
    }
  }
  return ops;
}

size_t count(const std::vector<uint8_t>& bytes, uint8_t code) {
  size_t n = 0;
  for (uint8_t c : opcodes(bytes)) n += c == code;
  return n;
}

}  // namespace

TEST_SUITE("pickle_writer") {

TEST_CASE("pickle_writer: reproduces CPython's protocol-2 bytes") {
  const char* cases[] = {
      // [None, True, False, 0, 255, 256, 65535, 65536, -1, 2**31-1, -2**31, 2**31, -2**63,
      //  2**64, 1.5, 'hé', '\ud800']
      "80025d7100284e88894b004bff4d00014dffff4a000001004affffffff4affffff7f4a000000808a0500000080"
      "008a0800000000000000808a09000000000000000001473ff8000000000000580300000068c3a9710158030000"
      "00eda0807102652e",
      // [b'', b'a\xff', <same>, bytearray(b'ab'), bytearray()]
      "80025d710028635f5f6275696c74696e5f5f0a62797465730a710129527102635f636f646563730a656e636f64"
      "650a7103580300000061c3bf710458060000006c6174696e3171058671065271076807635f5f6275696c74696e"
      "5f5f0a6279746561727261790a71086803580200000061627109680586710a52710b85710c52710d6808295271"
      "0e652e",
      // [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), [], {}, {'k': 'v'}, {1: 2, 3: 4}, {5},
      //  frozenset({6})]
      "80025d710028294b018571014b014b028671024b014b024b03877103284b014b024b034b047471045d71057d71"
      "067d710758010000006b71085801000000767109737d710a284b014b024b034b0475635f5f6275696c74696e5f"
      "5f0a7365740a710b5d710c4b056185710d52710e635f5f6275696c74696e5f5f0a66726f7a656e7365740a710f"
      "5d71104b0661857111527112652e",
      // x = [1]; [x, x, (x,), 'z']
      "80025d7100285d71014b01616801680185710258010000007a7103652e",
      // OrderedDict([('a', 1), ('b', [2])]) with _metadata = {'': {'version': 1}}
      "800263636f6c6c656374696f6e730a4f726465726564446963740a7100295271012858010000006171024b0158"
      "010000006271035d71044b0261757d710558090000005f6d6574616461746171067d7107580000000071087d71"
      "09580700000076657273696f6e710a4b01737373622e",
      // [len, collections.OrderedDict, set, KeyError]: Python 2 names via fix_imports
      "80025d710028635f5f6275696c74696e5f5f0a6c656e0a710163636f6c6c656374696f6e730a4f7264657265"
      "64446963740a7102635f5f6275696c74696e5f5f0a7365740a710363657863657074696f6e730a4b65794572"
      "726f720a7104652e",
  };
  for (const char* hex : cases) {
    CAPTURE(hex);
    std::vector<uint8_t> original = unhex(hex);
    document d = parse_bytes(original);
    CHECK(write(d.root) == original);
  }
}

TEST_CASE("pickle_writer: only protocol 2") {
  tree t;
  CHECK_THROWS_AS(write(t.integer(1), 4), ckpt::error);
  try {
    write(t.integer(1), 3);
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == errc::unsupported);
  }
  CHECK_THROWS_AS(write(nullptr), ckpt::error);
}

TEST_CASE("pickle_writer: shared nodes are written once and fetched from the memo") {
  tree t;
  value* x = t.list({t.integer(1)});
  value* root = t.list({x, x, t.tuple({x})});
  std::vector<uint8_t> bytes = write(root);
  document back = parse_bytes(bytes);
  const value* r = back.root;
  REQUIRE(r->items.size() == 3);
  CHECK(r->items[0] == r->items[1]);
  CHECK(r->items[2]->items[0] == r->items[0]);
  CHECK(count(bytes, op::BINGET) == 2);

  // Immutable scalars are memoized only when shared, so CPython's own output stays exact
  // while a hand-made sharing survives. (Not for None, bools, ints -5..256 and the empty
  // tuple: CPython shares those by itself, and the reader keeps one node for each.)
  tree s;
  value* n = s.integer(70000);
  value* pair = s.list({n, n, s.integer(70000)});
  document pb = parse_bytes(write(pair));
  CHECK(pb.root->items[0] == pb.root->items[1]);
  CHECK(pb.root->items[0] != pb.root->items[2]);

  // Storage references shared by two tensors stay one node.
  tree p;
  value* pid = p.make(kind::persistent_id);
  pid->items = {p.tuple({p.str("storage"), p.str("0")})};
  document pp = parse_bytes(write(p.list({pid, pid})));
  CHECK(pp.root->items[0] == pp.root->items[1]);
  CHECK(pp.root->items[0]->type == kind::persistent_id);

  // More than 255 memo entries switch to LONG_BINPUT / LONG_BINGET.
  tree m;
  value* big = m.list();
  std::vector<value*> strs;
  for (int i = 0; i < 300; ++i) strs.push_back(m.str("s" + std::to_string(i)));
  for (value* v : strs) big->items.push_back(v);
  for (value* v : strs) big->items.push_back(v);
  std::vector<uint8_t> mb = write(big);
  CHECK(count(mb, op::LONG_BINPUT) > 0);
  document md = parse_bytes(mb);
  REQUIRE(md.root->items.size() == 600);
  for (int i = 0; i < 300; ++i) CHECK(md.root->items[size_t(i)] == md.root->items[size_t(i) + 300]);
}

TEST_CASE("pickle_writer: cycles terminate and survive") {
  tree t;
  value* self = t.list();
  self->items = {self, self};
  document a = parse_bytes(write(self));
  CHECK(a.root->items[0] == a.root);
  CHECK(a.root->items[1] == a.root);

  tree d;
  value* dict = d.make(kind::dict);
  dict->items = {d.str("me"), dict};
  document b = parse_bytes(write(dict));
  CHECK(b.root->dict_value(0) == b.root);

  // A tuple reached again while its own elements are being written (through a list):
  // CPython pops what it pushed and fetches the memoized tuple.
  tree c;
  value* l = c.list();
  value* tup = c.tuple({l});
  l->items = {tup};
  std::vector<uint8_t> cb = write(tup);
  document cd = parse_bytes(cb);
  CHECK(cd.root->type == kind::tuple);
  CHECK(cd.root->items[0]->items[0] == cd.root);
  CHECK(count(cb, op::POP) == 1);

  // An object whose state refers to the object.
  tree o;
  value* obj = o.object(object_op::reduce, o.global("m", "C"), o.tuple());
  value* state = o.make(kind::dict);
  state->items = {o.str("me"), obj};
  obj->state = state;
  document od = parse_bytes(write(obj));
  CHECK(od.root->state->dict_value(0) == od.root);
}

TEST_CASE("pickle_writer: the memo keeps only the nodes it can meet again, in a map or an array") {
  // A shared tuple is open while its elements are written (its memo slot comes after
  // them): a list inside it, referred to once, is met again when the cycle returns to the
  // tuple. Enough of them turn the memo's map into an array over the document's nodes.
  for (int lists : {3, 20000}) {
    CAPTURE(lists);
    tree t;
    value* root = t.list();
    std::vector<value*> elements;
    for (int i = 0; i < lists; ++i) elements.push_back(t.list({t.str("s" + std::to_string(i % 7))}));
    value* tup = t.tuple(elements);
    elements[0]->items.push_back(tup);  // the cycle back to the open tuple
    root->items = {tup, tup};
    // The same bytes with the document's node numbers (array) as without (map only).
    const std::vector<uint8_t> with_doc = write(root, 2, &t.doc);
    CHECK(with_doc == write(root, 2));
    document back = parse_bytes(with_doc);
    REQUIRE(back.root->items.size() == 2);
    CHECK(back.root->items[0] == back.root->items[1]);
    const value* tup_back = back.root->items[0];
    REQUIRE(tup_back->items.size() == size_t(lists));
    CHECK(tup_back->items[0]->items[1] == tup_back);
    CHECK(tup_back->items[size_t(lists) - 1]->items[0]->text == "s" + std::to_string((lists - 1) % 7));
    // Written again from what was read, the stream is the same.
    CHECK(write(back.root, 2, &back) == with_doc);
  }
}

TEST_CASE("pickle_writer: objects, globals and the spellings protocol 2 lacks") {
  tree t;
  value* kw = t.make(kind::dict);
  kw->items = {t.str("b"), t.integer(2)};
  value* ex = t.object(object_op::newobj_ex, t.global("m", "C"), t.tuple({t.integer(1)}));
  ex->items[kKwargs] = kw;
  value* inst = t.object(object_op::inst, t.global("m", "D"), t.tuple({t.integer(3)}));
  value* slots = t.object(object_op::reduce, t.global("m", "E"), t.tuple());
  slots->items[kListItems] = t.list({t.integer(4)});
  value* dict_items = t.make(kind::dict);
  dict_items->items = {t.str("k"), t.integer(5)};
  slots->items[kDictItems] = dict_items;
  value* root = t.list({ex, inst, slots, t.global("m", "Outer.Inner")});
  std::vector<uint8_t> bytes = write(root);
  CHECK(count(bytes, op::NEWOBJ_EX) == 1);
  CHECK(count(bytes, op::OBJ) == 1);
  document back = parse_bytes(bytes);
  CHECK(repr(back.root, 1000) ==
        "[m.C(1, b=2), m.D(3), m.E().extend([4]).update({'k': 5}), "
        "builtins.getattr(m.Outer, 'Inner')]");
  CHECK(back.root->items[1]->op == object_op::obj);

  // Nested names share their memoized parents; absurdly nested ones are refused.
  tree dotted;
  std::vector<uint8_t> db = write(dotted.list({dotted.global("m", "A.B.C"), dotted.global("m", "A.B"),
                                               dotted.global("m", "A.B.D")}));
  CHECK(count(db, op::GLOBAL) == 2);  // builtins.getattr and m.A, once each
  CHECK(repr(parse_bytes(db).root, 1000) ==
        "[builtins.getattr(builtins.getattr(m.A, 'B'), 'C'), builtins.getattr(m.A, 'B'), "
        "builtins.getattr(builtins.getattr(m.A, 'B'), 'D')]");
  // The top-level name may be getattr itself, already in the memo by then.
  tree g;
  std::vector<uint8_t> gb = write(g.global("builtins", "getattr.x"));
  CHECK(count(gb, op::GLOBAL) == 1);
  CHECK(write(parse_bytes(gb).root) == gb);  // and the output is a fixed point
  std::string name = "a";
  for (int i = 0; i < 100000; ++i) name += ".b";
  CHECK_THROWS_AS(write(dotted.global("m", name)), ckpt::error);

  tree bad;
  try {
    write(bad.global("m\xc3\xa9", "x"));
    CHECK(false);
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == errc::unsupported);
    CHECK(e.message().find("ASCII") != std::string::npos);
  }
}

TEST_CASE("pickle_writer: integers of every size") {
  for (int64_t v : {int64_t(0), int64_t(255), int64_t(256), int64_t(65535), int64_t(65536),
                    int64_t(-1), int64_t(2147483647), int64_t(-2147483648LL),
                    int64_t(2147483648LL), INT64_MAX, INT64_MIN}) {
    CAPTURE(v);
    tree t;
    document d = parse_bytes(write(t.integer(v)));
    CHECK(d.root->type == kind::integer);
    CHECK(d.root->integer == v);
  }
  tree t;
  value* big = t.make(kind::big_integer);
  big->text = std::string(300, '\x11');  // LONG4 territory
  std::vector<uint8_t> bytes = write(big);
  CHECK(bytes[2] == op::LONG4);
  document d = parse_bytes(bytes);
  CHECK(d.root->type == kind::big_integer);
  CHECK(d.root->text == big->text);
}

TEST_CASE("pickle_writer: batches of 1000, as CPython writes them") {
  tree t;
  value* l = t.list();
  for (int i = 0; i < 1001; ++i) l->items.push_back(t.integer(i));
  std::vector<uint8_t> lb = write(l);
  // An exact list: every batch is MARK ... APPENDS, even a last batch of one.
  CHECK(count(lb, op::APPENDS) == 2);
  CHECK(parse_bytes(lb).root->items.size() == 1001);

  value* od = t.make(kind::dict);
  od->flag = true;
  for (int i = 0; i < 1001; ++i) {
    od->items.push_back(t.integer(i));
    od->items.push_back(t.integer(i));
  }
  std::vector<uint8_t> ob = write(od);
  // OrderedDict items come from an iterator: a last batch of one is SETITEM.
  CHECK(count(ob, op::SETITEMS) == 1);
  std::vector<uint8_t> ops = opcodes(ob);
  CHECK(ops[ops.size() - 2] == op::SETITEM);
  document back = parse_bytes(ob);
  CHECK(back.root->flag);
  CHECK(back.root->dict_size() == 1001);
}

TEST_CASE("pickle_writer: deep nesting is a limit error, not a crash") {
  tree t;
  value* v = t.integer(0);
  for (int i = 0; i < 20000; ++i) v = t.list({v});
  try {
    write(v);
    CHECK(false);
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == errc::limit);
  }
  tree ok;
  value* w = ok.integer(0);
  for (int i = 0; i < 5000; ++i) w = ok.list({w});
  CHECK_NOTHROW(write(w));
}

}  // TEST_SUITE

TEST_CASE("pickle_writer: a Python 2 global name from protocol 3+ is refused, never renamed") {
  // Protocol 3+ keeps "__builtin__" as written; protocol 2 readers would map it to
  // builtins, so writing it would name a different (live) global.
  const std::string bytes = std::string("\x80\x03", 2) + "c__builtin__\neval\n.";
  document d = parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  try {
    write(d.root);
    CHECK(false);
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == errc::unsupported);
    CHECK(e.message().find("builtins.eval") != std::string::npos);
  }
  // The Python 3 spelling is fine: it is written as protocol 2's __builtin__ on purpose.
  const std::string ok = std::string("\x80\x03", 2) + "cbuiltins\neval\n.";
  document d2 = parse(reinterpret_cast<const uint8_t*>(ok.data()), ok.size());
  CHECK_NOTHROW(write(d2.root));
}

TEST_CASE("pickle_writer: a dotted name read below protocol 4 is one attribute, and stays one") {
  // Protocol 2, GLOBAL 'm' 'A.B': CPython looks up the attribute named "A.B" of m.
  const std::string literal = std::string("\x80\x02") + "cm\nA.B\n.";
  document doc = parse_bytes(std::vector<uint8_t>(literal.begin(), literal.end()));
  REQUIRE(doc.root->type == kind::global);
  CHECK(doc.root->flag);
  std::vector<uint8_t> out = write(doc.root);
  CHECK(count(out, op::GLOBAL) == 1);
  CHECK(count(out, op::REDUCE) == 0);  // not respelled as getattr(m.A, 'B')
  document back = parse_bytes(out);
  CHECK((back.root->type == kind::global && back.root->flag && back.root->global_attr() == "A.B"));
  CHECK(write(back.root) == out);

  // Protocol 4, STACK_GLOBAL 'm' 'A.B': nested attributes, which protocol 2 spells with
  // getattr.
  const std::string nested = std::string("\x80\x04") + "\x8c\x01m\x8c\x03" + "A.B\x93.";
  document n = parse_bytes(std::vector<uint8_t>(nested.begin(), nested.end()));
  REQUIRE(n.root->type == kind::global);
  CHECK_FALSE(n.root->flag);
  CHECK(repr(parse_bytes(write(n.root)).root, 200) == "builtins.getattr(m.A, 'B')");
}

TEST_CASE("pickle_writer: write_to hands on write()'s bytes in pieces, without holding them whole") {
  // Over a megabyte of pickle (several pieces), with shared nodes (memo) and a long string.
  tree t;
  value* shared = t.str("shared.key.name.longer.than.sso");
  value* d = t.make(kind::dict);
  for (int i = 0; i < 60000; ++i) {
    d->items.push_back(t.str("model.layers." + std::to_string(i) + ".weight"));
    d->items.push_back(t.tuple({shared, t.integer(i)}));
  }
  d->items.push_back(t.str("big"));
  d->items.push_back(t.str(std::string(3 << 20, 'x')));
  const std::vector<uint8_t> whole = write(d, 2, &t.doc);
  REQUIRE(whole.size() > (5u << 20));
  for (const document* owner : {static_cast<const document*>(&t.doc), static_cast<const document*>(nullptr)}) {
    std::vector<uint8_t> streamed;
    size_t pieces = 0, largest = 0;
    const uint64_t n = write_to(
        [&](const uint8_t* p, size_t size) {
          ++pieces;
          largest = std::max(largest, size);
          streamed.insert(streamed.end(), p, p + size);
        },
        d, 2, owner);
    CHECK(n == whole.size());
    CHECK(streamed == whole);
    CHECK(pieces >= 4);
    // Pieces of about a megabyte; only the long string overruns one.
    CHECK(largest < (5u << 20));
  }
  // A sink's exception stops the writing and reaches the caller.
  CHECK_THROWS_AS(write_to([](const uint8_t*, size_t) { throw ckpt::error(errc::io, "disk full"); }, d, 2, &t.doc),
                  ckpt::error);
  CHECK_THROWS_AS(write_to([](const uint8_t*, size_t) {}, d, 3, &t.doc), ckpt::error);
}
