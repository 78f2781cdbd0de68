"""The ground floor: plain types every layer may import (SamplingParams, the outputs of a
request, the acceptance counters, chat messages, the numerics' names); they import nothing
else of verispec."""
