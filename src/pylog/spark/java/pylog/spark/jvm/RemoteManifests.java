package pylog.spark.jvm;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.NotDirectoryException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.regex.Pattern;
import java.util.zip.CRC32C;

/**
 * The newest manifest of a partition in a {@code file://} object store, read as {@code
 * pylog.tiered.manifest.read_manifest} reads it: the highest version that checks (header {@code
 * "pylog-remote-manifest 1 <crc32c of the body, 8 lowercase hex digits>\n"}, the CRC-32C of the JSON body,
 * its version, topic and partition those of the object's name, segments contiguous); a torn or corrupt
 * version is skipped for the one before it; a tombstone (the topic was deleted) names no segments. The
 * format is documented in {@code pylog/tiered/manifest.py} and docs/format.md.
 *
 * <p>Only a tiered log directory's task uses it, for offsets the local retention deleted after planning
 * that were uploaded after planning too (the pinned segments do not hold them). Stateless; reads only.
 */
final class RemoteManifests {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final Pattern NAME = Pattern.compile("^\\d{20}\\.json$");
  private static final String MAGIC = "pylog-remote-manifest";

  private RemoteManifests() {}

  /** The segments the newest valid manifest names (none when there is none, or it is a tombstone). */
  static NativePartition.RemoteSeg[] newest(String root, String topic, int partition) throws IOException {
    Path dir = Path.of(root, topic, Integer.toString(partition), "manifest");
    List<Long> versions = new ArrayList<>();
    try (DirectoryStream<Path> names = Files.newDirectoryStream(dir)) {
      for (Path p : names) {
        String name = p.getFileName().toString();
        if (NAME.matcher(name).matches()) {
          versions.add(Long.parseLong(name.substring(0, 20)));
        }
      }
    } catch (NoSuchFileException | NotDirectoryException e) {
      return new NativePartition.RemoteSeg[0];
    }
    Collections.sort(versions, Collections.reverseOrder());
    for (long version : versions) {
      byte[] raw;
      try {
        raw = Files.readAllBytes(dir.resolve(String.format("%020d.json", version)));
      } catch (NoSuchFileException e) {
        continue;
      }
      NativePartition.RemoteSeg[] segs = decode(raw, topic, partition, version);
      if (segs != null) {
        return segs;
      }
    }
    return new NativePartition.RemoteSeg[0];
  }

  /** The segments of one manifest object, or null when it does not check. */
  static NativePartition.RemoteSeg[] decode(byte[] raw, String topic, int partition, long version) {
    int nl = -1;
    for (int i = 0; i < raw.length; i++) {
      if (raw[i] == '\n') {
        nl = i;
        break;
      }
    }
    if (nl < 0) {
      return null;
    }
    String[] head = new String(raw, 0, nl, StandardCharsets.US_ASCII).split(" ");
    if (head.length != 3 || !MAGIC.equals(head[0])) {
      return null;
    }
    if (!"1".equals(head[1])) {
      throw new PylogReadException(
          "pylog.errors.UnsupportedFormatError",
          "remote manifest format " + head[1] + " of " + topic + "-" + partition + " is not known to this "
              + "pylog's JVM reader",
          null);
    }
    CRC32C crc = new CRC32C();
    crc.update(raw, nl + 1, raw.length - nl - 1);
    if (!String.format("%08x", crc.getValue()).equals(head[2])) {
      return null;
    }
    try {
      JsonNode m = JSON.readTree(new String(raw, nl + 1, raw.length - nl - 1, StandardCharsets.UTF_8));
      if (m.get("version").asLong() != version
          || !topic.equals(m.get("topic").asText())
          || m.get("partition").asInt() != partition) {
        return null;
      }
      if (m.path("deleted").asBoolean(false)) {
        return new NativePartition.RemoteSeg[0];
      }
      JsonNode segs = m.get("segments");
      NativePartition.RemoteSeg[] out = new NativePartition.RemoteSeg[segs.size()];
      for (int i = 0; i < out.length; i++) {
        JsonNode s = segs.get(i);
        JsonNode index = s.get("index");
        boolean hasIndex = index != null && !index.isNull();
        out[i] =
            new NativePartition.RemoteSeg(
                s.get("base_offset").asLong(),
                s.get("next_offset").asLong(),
                s.get("size").asLong(),
                s.get("max_timestamp").asLong(),
                s.get("key").asText(),
                null,
                hasIndex ? index.get("key").asText() : null,
                null,
                hasIndex ? index.get("size").asLong() : 0);
        if (out[i].next <= out[i].base || out[i].size <= 0 || (i > 0 && out[i - 1].next != out[i].base)) {
          return null;
        }
      }
      return out;
    } catch (IOException | RuntimeException e) {
      return null; // a field missing or of the wrong type: as a torn version
    }
  }
}
