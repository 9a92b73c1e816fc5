package pylog.spark.jvm;

import java.io.IOException;
import java.util.Collection;
import java.util.IdentityHashMap;
import java.util.Map;
import net.razorvine.pickle.Opcodes;
import net.razorvine.pickle.PickleException;
import net.razorvine.pickle.Unpickler;
import net.razorvine.pickle.objects.ClassDict;

/**
 * Finds the JVM plan of a URL read in the pickled state of a planned partition.
 *
 * <p>{@code pylog.spark.remote.RemoteRead} pickles as {@code _restore_remote_read(jvm_plan, ...)}, its
 * first argument the JSON of {@code pylog.spark.remote.jvm_plan} (made on the driver, presigned URLs
 * included). The rest of the state is Python objects this reader has no use for: they unpickle as {@link
 * ClassDict}s (a {@code __getstate__} that is not a dict is dropped), so the search does not depend on
 * how the planner's classes are laid out.
 */
final class PlanUnpickler extends Unpickler {
  /** What {@code _restore_remote_read} unpickles as here. */
  static final class RemotePlanText {
    final String json;

    RemotePlanText(String json) {
      this.json = json;
    }
  }

  static {
    Unpickler.registerConstructor(
        "pylog.spark.remote", "_restore_remote_read", args -> new RemotePlanText((String) args[0]));
  }

  @Override
  @SuppressWarnings("unchecked")
  protected Object dispatch(short key) throws PickleException, IOException {
    if (key == Opcodes.BUILD) {
      Object state = stack.pop();
      Object inst = stack.peek();
      if (inst instanceof ClassDict && state instanceof Map) {
        ((ClassDict) inst).putAll((Map<String, Object>) state);
      }
      return NO_RETURN_VALUE;
    }
    return super.dispatch(key);
  }

  /** The JVM plan JSON in the pickled {@code state}, or null when it holds none. */
  static String find(byte[] state) throws IOException {
    Object root = new PlanUnpickler().loads(state);
    RemotePlanText found = search(root, new IdentityHashMap<>(), 0);
    return found == null ? null : found.json;
  }

  private static RemotePlanText search(Object o, IdentityHashMap<Object, Boolean> seen, int depth) {
    if (o == null || depth > 64 || seen.put(o, Boolean.TRUE) != null) {
      return null;
    }
    if (o instanceof RemotePlanText) {
      return (RemotePlanText) o;
    }
    Iterable<?> children = null;
    if (o instanceof Object[]) {
      children = java.util.Arrays.asList((Object[]) o);
    } else if (o instanceof Map) {
      children = ((Map<?, ?>) o).values();
    } else if (o instanceof Collection) {
      children = (Collection<?>) o;
    }
    if (children != null) {
      for (Object c : children) {
        RemotePlanText r = search(c, seen, depth + 1);
        if (r != null) {
          return r;
        }
      }
    }
    return null;
  }
}
