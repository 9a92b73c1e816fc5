package pylog.spark.jvm;

import java.nio.ByteBuffer;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;

/**
 * Record headers into Spark's {@code headers array<struct<key:string,value:binary>>} column.
 *
 * <p>pylog stores a record's headers as one msgpack array of {@code [str, bin | nil]} pairs (what
 * {@code pylog.record.encode_headers} writes), or nothing when the record has none: such records get a
 * null, as in Spark's Kafka source. Anything else is reported as undecodable (only reachable with a
 * forged CRC).
 */
final class Headers {
  private final WritableColumnVector column;
  private final WritableColumnVector pairs;
  private final WritableColumnVector keys;
  private final WritableColumnVector values;
  private int appended;
  private int reserved;
  private int at;
  private ByteBuffer buf;
  private int end;

  Headers(WritableColumnVector column) {
    this.column = column;
    this.pairs = column.arrayData();
    this.keys = pairs.getChild(0);
    this.values = pairs.getChild(1);
  }

  /** Called after the column was reset for a new output batch. */
  void reset() {
    appended = 0;
  }

  void put(int row, ByteBuffer data, int pos, int len) {
    if (len == 0) {
      column.putNull(row);
      return;
    }
    buf = data;
    at = pos;
    end = pos + len;
    int count = arrayHeader();
    reserve(appended + count);
    column.putArray(row, appended, count);
    for (int i = 0; i < count; i++) {
      int e = appended + i;
      if (arrayHeader() != 2) {
        throw undecodable("a header is not a [key, value] pair");
      }
      int keyLen = stringHeader();
      keys.putByteArray(e, buf, take(keyLen), keyLen);
      if (peek() == 0xc0) {
        at++;
        values.putNull(e);
      } else {
        int valueLen = binHeader();
        values.putByteArray(e, buf, take(valueLen), valueLen);
      }
    }
    appended += count;
    if (at != end) {
      throw undecodable("bytes left after the headers");
    }
  }

  private void reserve(int n) {
    if (n > reserved) {
      reserved = Math.max(n, Math.max(reserved * 2, 1024));
      pairs.reserve(reserved);
      keys.reserve(reserved);
      values.reserve(reserved);
    }
  }

  private static PylogReadException undecodable(String why) {
    return new PylogReadException("undecodable record headers: " + why);
  }

  private int peek() {
    if (at >= end) {
      throw undecodable("truncated");
    }
    return buf.get(at) & 0xFF;
  }

  private int take(int n) {
    if (n < 0 || n > end - at) {
      throw undecodable("truncated");
    }
    int p = at;
    at += n;
    return p;
  }

  private int u8() {
    return buf.get(take(1)) & 0xFF;
  }

  private int u16() {
    return Short.toUnsignedInt(Short.reverseBytes(buf.getShort(take(2))));
  }

  private int u32() {
    long v = Integer.toUnsignedLong(Integer.reverseBytes(buf.getInt(take(4))));
    if (v > Integer.MAX_VALUE) {
      throw undecodable("length out of range");
    }
    return (int) v;
  }

  private int arrayHeader() {
    int b = u8();
    if ((b & 0xF0) == 0x90) {
      return b & 0x0F;
    }
    if (b == 0xdc) {
      return u16();
    }
    if (b == 0xdd) {
      return u32();
    }
    throw undecodable("expected an array");
  }

  private int stringHeader() {
    int b = u8();
    if ((b & 0xE0) == 0xa0) {
      return b & 0x1F;
    }
    if (b == 0xd9) {
      return u8();
    }
    if (b == 0xda) {
      return u16();
    }
    if (b == 0xdb) {
      return u32();
    }
    throw undecodable("a header key is not a string");
  }

  private int binHeader() {
    int b = u8();
    if (b == 0xc4) {
      return u8();
    }
    if (b == 0xc5) {
      return u16();
    }
    if (b == 0xc6) {
      return u32();
    }
    throw undecodable("a header value is not bytes");
  }
}
