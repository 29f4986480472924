// The 68 opcodes of pickle protocols 0-5, as CPython's Lib/pickle.py names them. Shared by
// the reader (pickle_machine.cpp) and the writer (pickle_writer.cpp).
#pragma once

#include <cstdint>

namespace ckpt::pickle::op {

constexpr uint8_t MARK = '(';
constexpr uint8_t STOP = '.';
constexpr uint8_t POP = '0';
constexpr uint8_t POP_MARK = '1';
constexpr uint8_t DUP = '2';
constexpr uint8_t FLOAT = 'F';
constexpr uint8_t INT = 'I';
constexpr uint8_t BININT = 'J';
constexpr uint8_t BININT1 = 'K';
constexpr uint8_t LONG = 'L';
constexpr uint8_t BININT2 = 'M';
constexpr uint8_t NONE = 'N';
constexpr uint8_t PERSID = 'P';
constexpr uint8_t BINPERSID = 'Q';
constexpr uint8_t REDUCE = 'R';
constexpr uint8_t STRING = 'S';
constexpr uint8_t BINSTRING = 'T';
constexpr uint8_t SHORT_BINSTRING = 'U';
constexpr uint8_t UNICODE = 'V';
constexpr uint8_t BINUNICODE = 'X';
constexpr uint8_t APPEND = 'a';
constexpr uint8_t BUILD = 'b';
constexpr uint8_t GLOBAL = 'c';
constexpr uint8_t DICT = 'd';
constexpr uint8_t EMPTY_DICT = '}';
constexpr uint8_t APPENDS = 'e';
constexpr uint8_t GET = 'g';
constexpr uint8_t BINGET = 'h';
constexpr uint8_t INST = 'i';
constexpr uint8_t LONG_BINGET = 'j';
constexpr uint8_t LIST = 'l';
constexpr uint8_t EMPTY_LIST = ']';
constexpr uint8_t OBJ = 'o';
constexpr uint8_t PUT = 'p';
constexpr uint8_t BINPUT = 'q';
constexpr uint8_t LONG_BINPUT = 'r';
constexpr uint8_t SETITEM = 's';
constexpr uint8_t TUPLE = 't';
constexpr uint8_t EMPTY_TUPLE = ')';
constexpr uint8_t SETITEMS = 'u';
constexpr uint8_t BINFLOAT = 'G';
// Protocol 2
constexpr uint8_t PROTO = 0x80;
constexpr uint8_t NEWOBJ = 0x81;
constexpr uint8_t EXT1 = 0x82;
constexpr uint8_t EXT2 = 0x83;
constexpr uint8_t EXT4 = 0x84;
constexpr uint8_t TUPLE1 = 0x85;
constexpr uint8_t TUPLE2 = 0x86;
constexpr uint8_t TUPLE3 = 0x87;
constexpr uint8_t NEWTRUE = 0x88;
constexpr uint8_t NEWFALSE = 0x89;
constexpr uint8_t LONG1 = 0x8a;
constexpr uint8_t LONG4 = 0x8b;
// Protocol 3
constexpr uint8_t BINBYTES = 'B';
constexpr uint8_t SHORT_BINBYTES = 'C';
// Protocol 4
constexpr uint8_t SHORT_BINUNICODE = 0x8c;
constexpr uint8_t BINUNICODE8 = 0x8d;
constexpr uint8_t BINBYTES8 = 0x8e;
constexpr uint8_t EMPTY_SET = 0x8f;
constexpr uint8_t ADDITEMS = 0x90;
constexpr uint8_t FROZENSET = 0x91;
constexpr uint8_t NEWOBJ_EX = 0x92;
constexpr uint8_t STACK_GLOBAL = 0x93;
constexpr uint8_t MEMOIZE = 0x94;
constexpr uint8_t FRAME = 0x95;
// Protocol 5
constexpr uint8_t BYTEARRAY8 = 0x96;
constexpr uint8_t NEXT_BUFFER = 0x97;
constexpr uint8_t READONLY_BUFFER = 0x98;

/// The opcode's name ("BINUNICODE"), or nullptr for a byte that is no opcode.
const char* name(uint8_t code);

}  // namespace ckpt::pickle::op
