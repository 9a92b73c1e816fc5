package pylog.spark.jvm;

/** A read that cannot go on: corrupt data, data loss, or a file that cannot be read. */
public final class PylogReadException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  PylogReadException(String message) {
    super(message);
  }

  PylogReadException(String message, Throwable cause) {
    super(message, cause);
  }
}
