package pylog.spark.jvm;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.BooleanType;
import org.apache.spark.sql.types.ByteType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DoubleType;
import org.apache.spark.sql.types.FloatType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.ShortType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;

/**
 * {@code valueFormat=msgpack}: each value is a msgpack map; the user's value columns are its entries.
 *
 * <p>As on the Python path: a null value (tombstone) or a missing key gives null, keys that are no column
 * are ignored (the last of duplicate keys wins), and a value of the wrong type is an error naming the
 * record. Scalar columns only (long, int, short, byte, double, float, string, binary, boolean; see {@link
 * #supports}); queries with other value columns are left on the Python path. Conversions follow pyarrow's:
 * floats into integer columns are truncated, booleans into floating columns are 0 or 1, str and bin are
 * both accepted for string and binary columns.
 */
final class MsgpackValues {
  private final String[] names;
  private final byte[][] keys;
  private final DataType[] types;
  private final WritableColumnVector[] vectors;
  private final int[] found;
  private final Msgpack in = new Msgpack("msgpack value");

  MsgpackValues(StructField[] fields, WritableColumnVector[] vectors) {
    int n = fields.length;
    this.names = new String[n];
    this.keys = new byte[n][];
    this.types = new DataType[n];
    this.vectors = vectors;
    this.found = new int[n];
    for (int i = 0; i < n; i++) {
      names[i] = fields[i].name();
      keys[i] = names[i].getBytes(StandardCharsets.UTF_8);
      types[i] = fields[i].dataType();
    }
  }

  static boolean supports(DataType t) {
    return t instanceof LongType
        || t instanceof IntegerType
        || t instanceof ShortType
        || t instanceof ByteType
        || t instanceof DoubleType
        || t instanceof FloatType
        || t instanceof StringType
        || t instanceof BinaryType
        || t instanceof BooleanType;
  }

  /** The value columns of {@code row} from the value at {@code pos} ({@code len < 0}: a null value). */
  void put(int row, ByteBuffer data, int pos, int len, NativePartition.Range range, long offset) {
    if (len < 0) {
      for (WritableColumnVector v : vectors) {
        v.putNull(row);
      }
      return;
    }
    in.reset(data, pos, len);
    try {
      int entries = in.mapHeader();
      if (entries < 0) {
        throw in.error("not a map");
      }
      Arrays.fill(found, -1);
      for (int e = 0; e < entries; e++) {
        int field = -1;
        int keyLen = in.stringHeader();
        if (keyLen >= 0) {
          field = match(data, in.take(keyLen), keyLen);
        } else {
          in.skip();
        }
        if (field >= 0) {
          found[field] = in.position();
        }
        in.skip();
      }
      if (!in.atEnd()) {
        throw in.error("more than one msgpack object");
      }
      for (int i = 0; i < vectors.length; i++) {
        if (found[i] < 0) {
          vectors[i].putNull(row);
        } else {
          in.seek(found[i]);
          convert(i, row, data);
        }
      }
    } catch (PylogReadException e) {
      throw PylogReadException.deserialization(
          "msgpack values do not fit the schema in " + range.topic + "-" + range.partition
              + " offset " + offset + ": " + e.getMessage());
    }
  }

  private int match(ByteBuffer data, int at, int len) {
    for (int i = 0; i < keys.length; i++) {
      byte[] k = keys[i];
      if (k.length == len && same(data, at, k)) {
        return i;
      }
    }
    return -1;
  }

  private static boolean same(ByteBuffer data, int at, byte[] k) {
    for (int j = 0; j < k.length; j++) {
      if (data.get(at + j) != k[j]) {
        return false;
      }
    }
    return true;
  }

  private void convert(int i, int row, ByteBuffer data) {
    WritableColumnVector v = vectors[i];
    DataType t = types[i];
    if (in.peek() == Msgpack.NIL) {
      v.putNull(row);
      return;
    }
    if (t instanceof StringType || t instanceof BinaryType) {
      int len = in.stringHeader();
      if (len < 0) {
        len = in.binHeader();
      }
      if (len < 0) {
        throw wrong(i);
      }
      v.putByteArray(row, data, in.take(len), len);
    } else if (t instanceof BooleanType) {
      if (!in.isBoolean()) {
        throw wrong(i);
      }
      v.putBoolean(row, in.bool());
    } else if (t instanceof DoubleType || t instanceof FloatType) {
      double d;
      if (in.isFloat()) {
        d = in.floating();
      } else if (in.isInteger()) {
        d = in.integer();
      } else if (in.isBoolean()) {
        d = in.bool() ? 1 : 0;
      } else {
        throw wrong(i);
      }
      if (t instanceof DoubleType) {
        v.putDouble(row, d);
      } else if (Double.isFinite(d) && Math.abs(d) > Float.MAX_VALUE) {
        throw in.error("column " + names[i] + " (float): " + d + " is out of range");
      } else {
        v.putFloat(row, (float) d);
      }
    } else {
      long x;
      if (in.isInteger()) {
        x = in.integer();
      } else if (in.isFloat()) {
        double d = in.floating();
        if (!(d >= -0x1p63 && d < 0x1p63)) {
          throw in.error("column " + names[i] + ": " + d + " is out of range");
        }
        x = (long) d;
      } else {
        throw wrong(i);
      }
      integral(i, row, x);
    }
  }

  private void integral(int i, int row, long x) {
    WritableColumnVector v = vectors[i];
    DataType t = types[i];
    if (t instanceof LongType) {
      v.putLong(row, x);
      return;
    }
    long lo = t instanceof IntegerType ? Integer.MIN_VALUE : t instanceof ShortType ? Short.MIN_VALUE : -128;
    long hi = t instanceof IntegerType ? Integer.MAX_VALUE : t instanceof ShortType ? Short.MAX_VALUE : 127;
    if (x < lo || x > hi) {
      throw in.error("column " + names[i] + " (" + t.simpleString() + "): " + x + " is out of range");
    }
    if (t instanceof IntegerType) {
      v.putInt(row, (int) x);
    } else if (t instanceof ShortType) {
      v.putShort(row, (short) x);
    } else {
      v.putByte(row, (byte) x);
    }
  }

  private PylogReadException wrong(int i) {
    return in.error(
        "column " + names[i] + " (" + types[i].simpleString() + ") got msgpack type 0x"
            + Integer.toHexString(in.peek()));
  }
}
