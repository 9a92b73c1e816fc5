package pylog.spark.jvm;

import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpHeaders;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.time.Duration;
import java.util.Optional;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * Byte ranges of the segment objects a task pinned, from the object store of a URL read.
 *
 * <p>A {@code file://} store is read as files ({@code root/key}, mapped read-only). Any other store the
 * planner could sign ({@code s3://}) is read through the presigned GET URLs the driver put into the plan,
 * with {@link HttpClient} and a {@code Range} header: the store's credentials never reach an executor. A
 * transient failure (5xx, 408, 429, a connection reset or timeout, a body cut short: the {@code
 * Content-Range} and length are checked) is retried {@value #RETRIES} times with exponential backoff, then
 * is pylog's {@code RemoteStorageError}; a refused URL (403: it expired, or its signature does not check)
 * is one at once, saying to raise {@code remoteStorage.presignExpirySeconds} or re-run the query. An
 * object that is not there (404, no such file) is {@link Gone} (the reader tells retention from a missing
 * object by whether a newer manifest version exists).
 *
 * <p>Thread-safe (the HTTP client is shared by the JVM's tasks); reads only.
 */
final class RemoteObjects {
  static final int RETRIES = 5;
  private static final long BACKOFF_MS = 100;
  private static final long MAX_BACKOFF_MS = 2000;
  private static final Pattern CONTENT_RANGE = Pattern.compile("^bytes (\\d+)-(\\d+)/(\\d+|\\*)$");
  private static volatile HttpClient http;

  /** An object the plan names is not in the store (any more): dropped after the query was planned. */
  static final class Gone extends IOException {
    private static final long serialVersionUID = 1L;

    Gone(String key) {
      super(key + " is not in the object store");
    }
  }

  private final NativePartition.RemotePlan plan;

  RemoteObjects(NativePartition.RemotePlan plan) {
    this.plan = plan;
  }

  boolean isFile() {
    return plan.isFile();
  }

  /** Bytes asked for at a time: a whole file of a {@code file://} store (mapped), 8 MiB over HTTP. */
  int window() {
    return plan.isFile() ? Integer.MAX_VALUE : 8 << 20;
  }

  /**
   * Exactly {@code len} bytes of the object from byte {@code pos} (little-endian), fewer only when the
   * object ends first (the caller checks that against the manifest).
   */
  ByteBuffer read(String key, String url, long pos, int len) throws IOException {
    if (plan.isFile()) {
      return readFile(plan.root + "/" + key, key, pos, len);
    }
    return readHttp(url, key, pos, len);
  }

  private static ByteBuffer readFile(String file, String key, long pos, int len) throws IOException {
    FileChannel ch;
    try {
      ch = FileChannel.open(Path.of(file), StandardOpenOption.READ);
    } catch (NoSuchFileException e) {
      throw new Gone(key);
    }
    try (ch) {
      long size = ch.size();
      long n = Math.max(0, Math.min(len, size - pos));
      ByteBuffer buf = ch.map(FileChannel.MapMode.READ_ONLY, pos, n);
      buf.order(ByteOrder.LITTLE_ENDIAN);
      return buf;
    }
  }

  private static HttpClient client() {
    HttpClient c = http;
    if (c == null) {
      synchronized (RemoteObjects.class) {
        c = http;
        if (c == null) {
          c =
              HttpClient.newBuilder()
                  .connectTimeout(Duration.ofSeconds(10))
                  .followRedirects(HttpClient.Redirect.NORMAL)
                  .version(HttpClient.Version.HTTP_1_1)
                  .build();
          http = c;
        }
      }
    }
    return c;
  }

  private ByteBuffer readHttp(String url, String key, long pos, int len) throws IOException {
    if (url == null) {
      throw new PylogReadException(
          PylogReadException.REMOTE, "the plan has no presigned URL for " + key, null);
    }
    String range = "bytes=" + pos + "-" + (pos + len - 1);
    String last = "";
    for (int attempt = 0; ; attempt++) {
      if (attempt > RETRIES) {
        throw new PylogReadException(
            PylogReadException.REMOTE,
            "GET " + key + " " + range + " failed " + attempt + " times; the last: " + last,
            null);
      }
      if (attempt > 0) {
        sleep(Math.min(MAX_BACKOFF_MS, BACKOFF_MS << Math.min(attempt - 1, 10)));
      }
      HttpResponse<byte[]> resp;
      try {
        HttpRequest req =
            HttpRequest.newBuilder(URI.create(url))
                .timeout(Duration.ofSeconds(60))
                .header("Range", range)
                .GET()
                .build();
        resp = client().send(req, HttpResponse.BodyHandlers.ofByteArray());
      } catch (IOException e) {
        last = e.toString(); // connection reset or refused, timeout, a body cut short
        continue;
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IOException("interrupted reading " + key, e);
      }
      int status = resp.statusCode();
      byte[] body = resp.body();
      if (status == 206) {
        long[] cr = contentRange(resp.headers());
        if (cr == null || cr[0] != pos || cr[1] - cr[0] + 1 != body.length) {
          last = "a ranged answer whose Content-Range " + resp.headers().firstValue("Content-Range")
              + " does not match its " + body.length + " bytes";
          continue;
        }
        if (body.length < len && (cr[2] < 0 || cr[1] + 1 < cr[2])) {
          last = "a ranged answer cut to " + body.length + " of " + len + " bytes";
          continue;
        }
        return ByteBuffer.wrap(body).order(ByteOrder.LITTLE_ENDIAN);
      }
      if (status == 200) { // the whole object: the server ignored the range
        Optional<String> length = resp.headers().firstValue("Content-Length");
        if (length.isPresent() && Long.parseLong(length.get().trim()) != body.length) {
          last = "an answer cut to " + body.length + " of " + length.get() + " bytes";
          continue;
        }
        int from = (int) Math.min(pos, body.length);
        int n = Math.min(len, body.length - from);
        return ByteBuffer.wrap(body, from, n).slice().order(ByteOrder.LITTLE_ENDIAN);
      }
      if (status == 404) {
        throw new Gone(key);
      }
      if (status == 416) { // the range starts past the object's end
        return ByteBuffer.allocate(0).order(ByteOrder.LITTLE_ENDIAN);
      }
      if (status == 403 || status == 401) {
        throw new PylogReadException(
            PylogReadException.REMOTE,
            "the object store refused the presigned URL of " + key + " (HTTP " + status
                + "): it expired (it was valid for " + plan.expirySeconds + " s from planning) or its "
                + "signature does not check. Raise remoteStorage.presignExpirySeconds, or re-run the "
                + "query (it signs its URLs again)",
            null);
      }
      last = "HTTP " + status;
      if (status >= 500 || status == 408 || status == 429) {
        continue;
      }
      throw new PylogReadException(
          PylogReadException.REMOTE, "GET " + key + " " + range + " answered HTTP " + status, null);
    }
  }

  /** {@code [first, last, total]} of a {@code Content-Range} header ({@code total} -1 when unknown). */
  private static long[] contentRange(HttpHeaders headers) {
    Optional<String> v = headers.firstValue("Content-Range");
    if (v.isEmpty()) {
      return null;
    }
    Matcher m = CONTENT_RANGE.matcher(v.get().trim());
    if (!m.matches()) {
      return null;
    }
    long total = "*".equals(m.group(3)) ? -1 : Long.parseLong(m.group(3));
    return new long[] {Long.parseLong(m.group(1)), Long.parseLong(m.group(2)), total};
  }

  private static void sleep(long ms) throws IOException {
    try {
      Thread.sleep(ms);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IOException("interrupted", e);
    }
  }
}
