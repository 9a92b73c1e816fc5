package pylog.spark.jvm;

/**
 * A read that cannot go on: corrupt data, data loss, or a file that cannot be read.
 *
 * <p>Each one carries the name of the pylog error class the Python path raises for the same failure
 * ({@code pylog.errors.CorruptRecordError}, {@code OffsetOutOfRangeError}, {@code DeserializationError},
 * {@code RemoteStorageError}),
 * and {@link #toString()} starts with it, as a Python traceback's last line does. Spark reports a failed
 * task with that string, so the driver's error names pylog's class on both paths.
 */
public final class PylogReadException extends RuntimeException {
  private static final long serialVersionUID = 2L;

  static final String CORRUPT = "pylog.errors.CorruptRecordError";
  static final String DATA_LOSS = "pylog.errors.OffsetOutOfRangeError";
  static final String DESERIALIZATION = "pylog.errors.DeserializationError";
  static final String REMOTE = "pylog.errors.RemoteStorageError";
  static final String OTHER = "pylog.errors.PylogError";

  private final String pylogClass;

  /** A corrupt batch (the most common cause, and the class of every decoder check). */
  PylogReadException(String message) {
    this(CORRUPT, message, null);
  }

  PylogReadException(String message, Throwable cause) {
    this(CORRUPT, message, cause);
  }

  PylogReadException(String pylogClass, String message, Throwable cause) {
    super(message, cause);
    this.pylogClass = pylogClass;
  }

  /** Planned records are gone (retention, truncation): pylog's {@code OffsetOutOfRangeError}. */
  static PylogReadException dataLoss(String message) {
    return new PylogReadException(DATA_LOSS, message, null);
  }

  /** A stored value does not fit the schema: pylog's {@code DeserializationError}. */
  static PylogReadException deserialization(String message) {
    return new PylogReadException(DESERIALIZATION, message, null);
  }

  /** The fully qualified name of the pylog error class this failure is, e.g. {@code pylog.errors.OffsetOutOfRangeError}. */
  public String pylogClass() {
    return pylogClass;
  }

  @Override
  public String toString() {
    return pylogClass + ": " + getMessage();
  }
}
