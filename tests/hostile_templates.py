"""Chat templates that froze the server (issue 33: a big-integer power ran 31 s on the event loop) or took
~190 MB per request before a bound was checked: the issue's (n from messages|length), then more that multiply
a size in one operation. Each renderer of a GGUF's template must refuse them in bounded time and memory."""

DEEP = "[" * 40 + "1" + "]" * 40
HOSTILE = {
    "power": "{% set n = messages|length %}{% set x = ((6 + n) ** 65536) ** 256 %}{{ x }}",
    "format-filter": "{% set n = messages|length %}{{ '%0200000000d' | format(n) }}",
    "percent-star": "{% set n = messages|length %}{{ '%*d' % (200000000, n) }}",
    "str-format-nested": "{% set n = messages|length %}{{ '{:>{}}'.format(n, '200000000') }}",
    "tojson-indent": "{{ %s | tojson(indent=65536) }}" % DEEP,
    "percent-many": "{{ ('%65536d' * 64) % ((1,) * 64) }}",
    "concat": "{% set s = 'x' * 4000000 %}{% set s = s ~ s ~ s %}{{ s }}",
    "replace": "{% set s = 'x' * 40000 %}{{ s.replace('x', s) }}",
    "indent": "{{ ('\\n' * 60000) | indent(65536) }}",
    "join": "{{ range(1000) | map('string') | join('y' * 60000) }}",
    "expandtabs": "{{ ('\\t' * 1000000).expandtabs(65536) }}",
    "multiply": "{% set x = 7 ** 20000 %}{{ x * x * x * x }}",
}
MESSAGES = [{"role": "user", "content": "hi"}]
