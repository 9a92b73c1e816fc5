package pylog.spark.jvm;

import com.github.luben.zstd.Zstd;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.zip.CRC32C;
import java.util.zip.GZIPInputStream;
import net.jpountz.lz4.LZ4Factory;
import net.jpountz.lz4.LZ4SafeDecompressor;
import org.xerial.snappy.Snappy;

/**
 * Record batches of pylog's on-disk format 1 ({@code docs/format.md}, owner {@code pylog/record.py}),
 * decoded with the same checks as {@code pylog.record.decode_batch}: header bounds, CRC-32C of bytes
 * {@code [16, batch_length)}, payload length, column widths, timestamps against the header, offset deltas
 * strictly increasing from 0 to {@code last_offset_delta}, and record lengths adding up to the payload.
 *
 * <p>Header (64 bytes, little-endian): base_offset i64 @0, batch_length i32 @8, crc u32 @12, magic u8 @16,
 * attributes i16 @18 (bits 0-2 compression: 1 gzip, 2 snappy block, 3 lz4 block, 4 zstd; bit 3 LogAppendTime),
 * last_offset_delta i32 @20, base_timestamp i64 @24, max_timestamp i64 @32, record_count i32 @56,
 * payload_length i32 @60. Payload: widths (ts, delta, key, value, header) in bytes 0-4, then the timestamp
 * deltas, offset deltas, key lengths, value lengths, header lengths, key bytes, value bytes, header bytes.
 */
final class BatchDecoder {
  static final int HEADER_SIZE = 64;
  static final int LAYOUT_SIZE = 8;
  private static final int MAGIC = 1;
  private static final int MAX_RECORDS = 1 << 24;
  private static final LZ4SafeDecompressor LZ4 = LZ4Factory.fastestInstance().safeDecompressor();

  private BatchDecoder() {}

  /** The fixed header of a batch. */
  static final class Header {
    long baseOffset;
    int batchLength;
    int crc;
    int attributes;
    int lastOffsetDelta;
    long baseTimestamp;
    long maxTimestamp;
    int recordCount;
    int payloadLength;

    long lastOffset() {
      return baseOffset + lastOffsetDelta;
    }
  }

  /** The columns of one decoded batch; the arrays are reused from batch to batch. */
  static final class Decoded {
    final Header header = new Header();
    int count;
    long[] offsets = new long[0];
    long[] timestamps = new long[0];
    int[] keyPos = new int[0];
    int[] keyLen = new int[0];
    int[] valuePos = new int[0];
    int[] valueLen = new int[0];
    /** Headers of each record: a msgpack array of [str, bin|nil] pairs; length 0 when it has none. */
    int[] headerPos = new int[0];
    int[] headerLen = new int[0];
    /** Where key and value bytes live: the mapped segment, or the decompressed payload. */
    ByteBuffer data;

    int timestampType() {
      return (header.attributes >> 3) & 1;
    }

    private void ensure(int n) {
      if (offsets.length < n) {
        int c = Math.max(n, 64);
        offsets = new long[c];
        timestamps = new long[c];
        keyPos = new int[c];
        keyLen = new int[c];
        valuePos = new int[c];
        valueLen = new int[c];
        headerPos = new int[c];
        headerLen = new int[c];
      }
      count = n;
    }
  }

  static PylogReadException corrupt(String what, int pos) {
    return new PylogReadException(what + " at position " + pos);
  }

  /** Decode and bounds-check the header at {@code pos}; {@code limit} is where valid bytes end. */
  static Header header(ByteBuffer buf, int pos, int limit) {
    return header(buf, pos, limit, new Header());
  }

  static Header header(ByteBuffer buf, int pos, int limit, Header h) {
    if ((long) pos + HEADER_SIZE > limit) {
      throw new PylogReadException("truncated batch header at position " + pos);
    }
    h.baseOffset = buf.getLong(pos);
    h.batchLength = buf.getInt(pos + 8);
    h.crc = buf.getInt(pos + 12);
    int magic = buf.get(pos + 16) & 0xFF;
    h.attributes = buf.getShort(pos + 18);
    h.lastOffsetDelta = buf.getInt(pos + 20);
    h.baseTimestamp = buf.getLong(pos + 24);
    h.maxTimestamp = buf.getLong(pos + 32);
    h.recordCount = buf.getInt(pos + 56);
    h.payloadLength = buf.getInt(pos + 60);
    if (magic != MAGIC) {
      if (magic > MAGIC && h.batchLength >= HEADER_SIZE) {
        throw new PylogReadException(
            "batch at position " + pos + " has format version " + magic
                + "; this pylog reads version " + MAGIC);
      }
      throw corrupt("bad magic " + magic, pos);
    }
    if (h.batchLength < HEADER_SIZE + LAYOUT_SIZE || (long) pos + h.batchLength > limit) {
      throw corrupt("batch length " + h.batchLength + " is out of bounds", pos);
    }
    if (h.recordCount < 1 || h.recordCount > MAX_RECORDS || h.lastOffsetDelta < h.recordCount - 1) {
      throw corrupt("bad record count or offset delta", pos);
    }
    if (h.baseOffset < 0
        || h.baseOffset > Long.MAX_VALUE - h.lastOffsetDelta
        || h.payloadLength < LAYOUT_SIZE
        || h.maxTimestamp < h.baseTimestamp) {
      throw corrupt("impossible header field values", pos);
    }
    return h;
  }

  /** Decode (and CRC-check) the batch at {@code pos} of {@code seg} into {@code out}. */
  static void decode(ByteBuffer seg, int pos, int limit, Decoded out) {
    Header h = header(seg, pos, limit, out.header);
    CRC32C crc = new CRC32C();
    crc.update(seg.slice(pos + 16, h.batchLength - 16));
    if ((int) crc.getValue() != h.crc) {
      throw new PylogReadException(
          "CRC mismatch in batch at position " + pos + " (base offset " + h.baseOffset + ")");
    }
    int code = h.attributes & 7;
    int bodyLen = h.batchLength - HEADER_SIZE;
    ByteBuffer data;
    int at;
    if (code != 0) {
      data = ByteBuffer.wrap(decompress(code, seg, pos + HEADER_SIZE, bodyLen, h.payloadLength))
          .order(ByteOrder.LITTLE_ENDIAN);
      at = 0;
    } else if (bodyLen != h.payloadLength) {
      throw corrupt("payload length mismatch", pos);
    } else {
      data = seg;
      at = pos + HEADER_SIZE;
    }
    try {
      columns(h, data, at, out);
    } catch (PylogReadException e) {
      throw new PylogReadException(e.getMessage() + " (batch at position " + pos + ")");
    }
  }

  private static byte[] decompress(int code, ByteBuffer seg, int at, int len, int size) {
    long maxRatio = code == 1 ? 1032 : code == 2 ? 22 : code == 3 ? 255 : code == 4 ? (1 << 15) : -1;
    if (maxRatio < 0) {
      throw new PylogReadException("unknown compression code " + code);
    }
    if (size > maxRatio * len + 64) {
      throw new PylogReadException(
          "payload length " + size + " is impossible for " + len + " compressed bytes");
    }
    byte[] body = new byte[len];
    seg.get(at, body, 0, len);
    byte[] out;
    try {
      if (code == 1) {
        try (GZIPInputStream in = new GZIPInputStream(new ByteArrayInputStream(body))) {
          out = in.readNBytes(size);
          if (in.read() != -1) {
            throw new PylogReadException("decompressed payload is longer than the header says");
          }
        }
      } else if (code == 2) {
        if (Snappy.uncompressedLength(body, 0, len) != size) {
          throw new PylogReadException("snappy block length differs from the header's payload length");
        }
        out = new byte[size];
        Snappy.uncompress(body, 0, len, out, 0);
      } else if (code == 3) {
        out = new byte[size];
        int n = LZ4.decompress(body, 0, len, out, 0, size);
        if (n != size) {
          throw new PylogReadException(
              "decompressed payload is " + n + " bytes, header says " + size);
        }
      } else {
        out = Zstd.decompress(body, size);
      }
    } catch (PylogReadException e) {
      throw e;
    } catch (IOException | RuntimeException e) {
      throw new PylogReadException("batch payload does not decompress: " + e, e);
    }
    if (out.length != size) {
      throw new PylogReadException(
          "decompressed payload is " + out.length + " bytes, header says " + size);
    }
    return out;
  }

  private static long unsigned(ByteBuffer b, int at, int width) {
    switch (width) {
      case 1:
        return b.get(at) & 0xFFL;
      case 2:
        return b.getShort(at) & 0xFFFFL;
      case 4:
        return b.getInt(at) & 0xFFFFFFFFL;
      default:
        return b.getLong(at); // 8 bytes: a value past the int64 range reads negative and fails the checks
    }
  }

  private static int signed(ByteBuffer b, int at, int width) {
    switch (width) {
      case 1:
        return b.get(at);
      case 2:
        return b.getShort(at);
      default:
        return b.getInt(at);
    }
  }

  private static void columns(Header h, ByteBuffer d, int start, Decoded out) {
    int n = h.recordCount;
    int len = h.payloadLength;
    int tsW = d.get(start) & 0xFF;
    int deltaW = d.get(start + 1) & 0xFF;
    int keyW = d.get(start + 2) & 0xFF;
    int valueW = d.get(start + 3) & 0xFF;
    int headerW = d.get(start + 4) & 0xFF;
    if (!(tsW == 0 || tsW == 1 || tsW == 2 || tsW == 4 || tsW == 8)
        || !(deltaW == 0 || deltaW == 1 || deltaW == 2 || deltaW == 4)
        || !(keyW == 1 || keyW == 2 || keyW == 4)
        || !(valueW == 1 || valueW == 2 || valueW == 4)
        || !(headerW == 0 || headerW == 1 || headerW == 2 || headerW == 4)) {
      throw new PylogReadException("bad column width");
    }
    if (LAYOUT_SIZE + (long) n * (tsW + deltaW + keyW + valueW + headerW) > len) {
      throw new PylogReadException("columns run past the payload");
    }
    out.ensure(n);
    out.data = d;
    int at = start + LAYOUT_SIZE;
    long span = h.maxTimestamp - h.baseTimestamp;
    if (tsW > 0) {
      long min = Long.MAX_VALUE;
      long max = Long.MIN_VALUE;
      for (int i = 0; i < n; i++, at += tsW) {
        long delta = unsigned(d, at, tsW);
        min = Math.min(min, delta);
        max = Math.max(max, delta);
        out.timestamps[i] = h.baseTimestamp + delta;
      }
      if (min != 0 || max != span) {
        throw new PylogReadException("timestamps disagree with the batch header");
      }
    } else {
      if (span != 0) {
        throw new PylogReadException("timestamps disagree with the batch header");
      }
      java.util.Arrays.fill(out.timestamps, 0, n, h.baseTimestamp);
    }
    if (deltaW > 0) {
      long prev = -1;
      for (int i = 0; i < n; i++, at += deltaW) {
        long delta = unsigned(d, at, deltaW);
        if (delta <= prev || (i == 0 && delta != 0)) {
          throw new PylogReadException(
              "offset deltas are not increasing from 0 to last_offset_delta");
        }
        prev = delta;
        out.offsets[i] = h.baseOffset + delta;
      }
      if (prev != h.lastOffsetDelta) {
        throw new PylogReadException("offset deltas are not increasing from 0 to last_offset_delta");
      }
    } else {
      if (h.lastOffsetDelta != n - 1) {
        throw new PylogReadException("dense batch with wrong last_offset_delta");
      }
      for (int i = 0; i < n; i++) {
        out.offsets[i] = h.baseOffset + i;
      }
    }
    long keyTotal = lengths(d, at, keyW, n, out.keyLen);
    at += keyW * n;
    long valueTotal = lengths(d, at, valueW, n, out.valueLen);
    at += valueW * n;
    long headerTotal = 0;
    for (int i = 0; i < n; i++) {
      int l = headerW > 0 ? (int) unsigned(d, at + i * headerW, headerW) : 0;
      if (l < 0) {
        throw new PylogReadException("record lengths do not add up to the payload length");
      }
      out.headerLen[i] = l;
      headerTotal += l;
    }
    at += headerW * n;
    if (at - start + keyTotal + valueTotal + headerTotal != len) {
      throw new PylogReadException("record lengths do not add up to the payload length");
    }
    int pos = at;
    for (int i = 0; i < n; i++) {
      out.keyPos[i] = pos;
      pos += Math.max(out.keyLen[i], 0);
    }
    for (int i = 0; i < n; i++) {
      out.valuePos[i] = pos;
      pos += Math.max(out.valueLen[i], 0);
    }
    for (int i = 0; i < n; i++) {
      out.headerPos[i] = pos;
      pos += out.headerLen[i];
    }
  }

  /** Signed lengths (-1 = null) into {@code lens}; their sum without nulls. */
  private static long lengths(ByteBuffer d, int at, int width, int n, int[] lens) {
    long total = 0;
    for (int i = 0; i < n; i++, at += width) {
      int v = signed(d, at, width);
      if (v < -1) {
        throw new PylogReadException("negative record length");
      }
      lens[i] = v;
      total += Math.max(v, 0);
    }
    return total;
  }
}
