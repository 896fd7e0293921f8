"""SGLang in attngate's loop: SGLang 0.5.23's own resolution as the oracle (``attngate conform``) and the
start-up check an SGLang launcher makes (:func:`verify`). Needs the sglang extra (see :data:`oracle.INSTALL`);
importing this package does not import SGLang."""

from attngate.integrations.sglang.fields import from_sglang, to_sglang_kwargs
from attngate.integrations.sglang.verify import SglangMismatchError, verify

__all__ = ["SglangMismatchError", "from_sglang", "to_sglang_kwargs", "verify"]
