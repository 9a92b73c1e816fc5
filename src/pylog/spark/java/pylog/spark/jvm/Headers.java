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
  private final Msgpack in = new Msgpack("undecodable record headers");
  private int appended;
  private int reserved;

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
    in.reset(data, pos, len);
    int count = in.arrayHeader();
    if (count < 0) {
      throw in.error("expected an array");
    }
    reserve(appended + count);
    column.putArray(row, appended, count);
    for (int i = 0; i < count; i++) {
      int e = appended + i;
      if (in.arrayHeader() != 2) {
        throw in.error("a header is not a [key, value] pair");
      }
      int keyLen = in.stringHeader();
      if (keyLen < 0) {
        throw in.error("a header key is not a string");
      }
      keys.putByteArray(e, data, in.take(keyLen), keyLen);
      if (in.peek() == Msgpack.NIL) {
        in.skip();
        values.putNull(e);
        continue;
      }
      int valueLen = in.binHeader();
      if (valueLen < 0) {
        throw in.error("a header value is not bytes");
      }
      values.putByteArray(e, data, in.take(valueLen), valueLen);
    }
    appended += count;
    if (!in.atEnd()) {
      throw in.error("bytes left after the headers");
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
}
