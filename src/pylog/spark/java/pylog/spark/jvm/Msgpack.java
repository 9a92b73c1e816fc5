package pylog.spark.jvm;

import java.nio.ByteBuffer;

/**
 * A cursor over msgpack bytes in a (mapped or decompressed) buffer: the few reads pylog's JVM reader needs,
 * each bounds-checked against the end of the object being read. Errors are {@link PylogReadException}s
 * whose message starts with the caller's {@code what}.
 */
final class Msgpack {
  static final int NIL = 0xc0;

  private final String what;
  private ByteBuffer buf;
  private int at;
  private int end;

  Msgpack(String what) {
    this.what = what;
  }

  void reset(ByteBuffer buf, int pos, int len) {
    this.buf = buf;
    this.at = pos;
    this.end = pos + len;
  }

  boolean atEnd() {
    return at == end;
  }

  int position() {
    return at;
  }

  void seek(int pos) {
    at = pos;
  }

  PylogReadException error(String why) {
    return new PylogReadException(what + ": " + why);
  }

  int peek() {
    if (at >= end) {
      throw error("truncated");
    }
    return buf.get(at) & 0xFF;
  }

  /** Position of the next {@code n} bytes, which the cursor moves past. */
  int take(long n) {
    if (n < 0 || n > end - at) {
      throw error("truncated");
    }
    int p = at;
    at += (int) n;
    return p;
  }

  private int u8() {
    return buf.get(take(1)) & 0xFF;
  }

  private int u16() {
    return Short.toUnsignedInt(Short.reverseBytes(buf.getShort(take(2))));
  }

  private long u32() {
    return Integer.toUnsignedLong(Integer.reverseBytes(buf.getInt(take(4))));
  }

  private long i64() {
    return Long.reverseBytes(buf.getLong(take(8)));
  }

  private int length(long n) {
    if (n > Integer.MAX_VALUE) {
      throw error("length out of range");
    }
    return (int) n;
  }

  /** Elements of an array header, or -1 (nothing read) when the next object is not an array. */
  int arrayHeader() {
    int b = peek();
    if ((b & 0xF0) == 0x90) {
      at++;
      return b & 0x0F;
    }
    if (b == 0xdc || b == 0xdd) {
      at++;
      return b == 0xdc ? u16() : length(u32());
    }
    return -1;
  }

  /** Entries of a map header, or -1 (nothing read) when the next object is not a map. */
  int mapHeader() {
    int b = peek();
    if ((b & 0xF0) == 0x80) {
      at++;
      return b & 0x0F;
    }
    if (b == 0xde || b == 0xdf) {
      at++;
      return b == 0xde ? u16() : length(u32());
    }
    return -1;
  }

  /** Length of a str (bytes follow at {@link #position()}), or -1 (nothing read) for another type. */
  int stringHeader() {
    int b = peek();
    if ((b & 0xE0) == 0xa0) {
      at++;
      return b & 0x1F;
    }
    switch (b) {
      case 0xd9:
        at++;
        return u8();
      case 0xda:
        at++;
        return u16();
      case 0xdb:
        at++;
        return length(u32());
      default:
        return -1;
    }
  }

  /** Length of a bin (bytes follow at {@link #position()}), or -1 (nothing read) for another type. */
  int binHeader() {
    switch (peek()) {
      case 0xc4:
        at++;
        return u8();
      case 0xc5:
        at++;
        return u16();
      case 0xc6:
        at++;
        return length(u32());
      default:
        return -1;
    }
  }

  /** True when the next object is an integer (any width, signed or not). */
  boolean isInteger() {
    int b = peek();
    return b <= 0x7f || b >= 0xe0 || (b >= 0xcc && b <= 0xd3);
  }

  /** The next integer; an unsigned 64-bit value above Long.MAX_VALUE is an error. */
  long integer() {
    int b = peek();
    at++;
    if (b <= 0x7f) {
      return b;
    }
    if (b >= 0xe0) {
      return (byte) b;
    }
    switch (b) {
      case 0xcc:
        return u8();
      case 0xcd:
        return u16();
      case 0xce:
        return u32();
      case 0xcf:
        long v = i64();
        if (v < 0) {
          throw error("integer out of range");
        }
        return v;
      case 0xd0:
        return buf.get(take(1));
      case 0xd1:
        return Short.reverseBytes(buf.getShort(take(2)));
      case 0xd2:
        return Integer.reverseBytes(buf.getInt(take(4)));
      case 0xd3:
        return i64();
      default:
        at--;
        throw error("not an integer");
    }
  }

  boolean isFloat() {
    int b = peek();
    return b == 0xca || b == 0xcb;
  }

  double floating() {
    int b = peek();
    at++;
    if (b == 0xca) {
      return Float.intBitsToFloat(Integer.reverseBytes(buf.getInt(take(4))));
    }
    if (b == 0xcb) {
      return Double.longBitsToDouble(i64());
    }
    at--;
    throw error("not a float");
  }

  boolean isBoolean() {
    int b = peek();
    return b == 0xc2 || b == 0xc3;
  }

  boolean bool() {
    return u8() == 0xc3;
  }

  /** Skip one object, nested ones included (iteratively: depth does not matter). */
  void skip() {
    long pending = 1;
    while (pending > 0) {
      pending--;
      int b = u8();
      if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
        continue;
      }
      if ((b & 0xF0) == 0x80) {
        pending += 2L * (b & 0x0F);
      } else if ((b & 0xF0) == 0x90) {
        pending += b & 0x0F;
      } else if ((b & 0xE0) == 0xa0) {
        take(b & 0x1F);
      } else {
        switch (b) {
          case 0xc4:
          case 0xd9:
            take(u8());
            break;
          case 0xc5:
          case 0xda:
            take(u16());
            break;
          case 0xc6:
          case 0xdb:
            take(u32());
            break;
          case 0xc7:
            take(u8() + 1L);
            break;
          case 0xc8:
            take(u16() + 1L);
            break;
          case 0xc9:
            take(u32() + 1L);
            break;
          case 0xca:
          case 0xce:
          case 0xd2:
            take(4);
            break;
          case 0xcb:
          case 0xcf:
          case 0xd3:
            take(8);
            break;
          case 0xcc:
          case 0xd0:
            take(1);
            break;
          case 0xcd:
          case 0xd1:
            take(2);
            break;
          case 0xd4:
            take(2);
            break;
          case 0xd5:
            take(3);
            break;
          case 0xd6:
            take(5);
            break;
          case 0xd7:
            take(9);
            break;
          case 0xd8:
            take(17);
            break;
          case 0xdc:
            pending += u16();
            break;
          case 0xdd:
            pending += u32();
            break;
          case 0xde:
            pending += 2L * u16();
            break;
          case 0xdf:
            pending += 2L * u32();
            break;
          default:
            throw error("invalid msgpack byte 0x" + Integer.toHexString(b));
        }
      }
    }
  }
}
