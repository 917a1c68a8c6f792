"""The refusals both edges word identically, as templates: the privacy floor's, a table's,
the bundle that serves dchi-text only, the bundle pins'. Python formats them here
(``TEMPLATE.format(**values)``); the mechanism spec (``shared.spec``) carries them to the
web edge, which formats the same fields the same way.

Placeholders are Python format fields: ``{name}`` as is, ``{name:g}`` (%g: 6 significant
digits), ``{name:.3g}``, ``{name:,}`` (an integer with thousands commas). A share ``p`` is
written by :func:`pct`: "100%" at 1, else 100·p with two decimals and "%".
"""

from __future__ import annotations

# -- the privacy floor (shared.floor) -----------------------------------------------------------
WEAK_HEAD = "{what} is weaker than the privacy floor"
DCHI_WHAT = "{mechanism} eta={eta:g}"
DCHI_DEGENERATE = "{head}: the bundle's table is degenerate: {problem}"
DCHI_NOT_FINITE = "{head}: the worst-case epsilon per token (eta x 2 max||phi||) is not finite"
DCHI_MEASURED = ("{head}: {share} of {drawn:,} tokens drawn at random {outcome} "
                 "(floor {floor}; on this bundle it starts near eta={start:.3g})")
DCHI_TEXT_OUTCOME = "came back unchanged"
DCHI_EMBEDDING_OUTCOME = "were their own nearest token after the noise"
LAPLACE_WHAT = "laplace epsilon={epsilon:g}"
LAPLACE_NOT_FINITE = "{head}: the worst-case epsilon of the vector is not finite"
LAPLACE_ROUNDING = ("{head}: the noise (scale {scale:.3g}) leaves every coordinate within "
                    "float32 rounding (2^-23) of the raw vector with probability {share} "
                    "(floor {floor})")
BITS_WHAT = "{mechanism} {params}"  # params: BITS_PARAM of each, joined by BITS_PARAM_JOIN
BITS_PARAM = "{name}={value:g}"
BITS_PARAM_JOIN = ", "
BITS_NOT_FINITE = ("{head}: the worst-case epsilon is not finite (a flip probability rounds to "
                   "0 or 1, so some outputs certify the input)")
BITS_FIXED = ("{head}: with probability {share} every one of the {n_bits} bits is a fixed "
              "function of the input bit (floor {floor})")
NONE_REFUSED = "mechanism none sends plain token ids: there is no privatization at all"

# -- a degenerate privatization table (shared.floor.table_problem) --------------------------
TABLE_NON_FINITE = "its table has non-finite values"
TABLE_SUBNORMAL = ("{values:,} of its table's values are subnormal (below float32's smallest "
                   "normal number, 1.18e-38): the distances between its rows are lost to "
                   "rounding")
TABLE_IDENTICAL = ("{tokens:,} of its {rows:,} regular tokens share {groups:,} rows "
                   "(identical rows: the search can never return some of them)")
TABLE_NEAR_DUPLICATES = ("{close} of {n} regular rows drawn at random lie within {near:g} x the "
                         "median nearest-row distance of another row (near-duplicate rows)")

# -- parameters the arithmetic cannot carry (shared.mechanisms.computable) ------------------
DCHI_TOO_SMALL = ("eta={eta:g} is too small to compute: the noise norm (up to {norm:.3g}) "
                  "overflows {where}")
DCHI_TABLE_NOT_FINITE = ("the bundle's table has a row whose norm is not finite (infinite or "
                         "NaN values, or values too large to square in float32): nothing can "
                         "be privatized over it")
DCHI_INVERSE_OVERFLOW = "eta={eta:g} is too small to compute: 1/eta overflows"
DCHI_NOISE_OVERFLOW = "eta={eta:g} is too small to compute: the noise overflows float32"
LAPLACE_TOO_SMALL = ("epsilon={epsilon:g} is too small to compute: the Laplace noise (scale "
                     "{scale:.3g}) overflows float32")
WHERE_FLOAT16 = "a float16 payload"
WHERE_FLOAT32 = "float32"

# -- the dχ guarantee (shared.accounting; the web edge's accounting) ----------------------------
DCHI_STATEMENT = ("eta*d(x, x')-privacy per token, d = Euclidean distance between word "
                  "embeddings (Qu et al. 2021 §3.2)")
DCHI_EPSILON_SCOPE = "any two tokens of the vocabulary, per token (eta x 2 max ||phi||)"
# under a token policy (shared.policy): what the guarantee covers, and what it does not
DCHI_POLICY_SCOPE = ("any two tokens outside the public list, per token (eta x 2 max ||phi||); "
                     "public words: none")
DCHI_POLICY_CLAUSE = ("on words outside the public list; the {size:,} public words of policy "
                      "{policy} are sent unchanged with probability {keep:g} and have no "
                      "guarantee")

# -- the budget ledger (shared.ledger) --------------------------------------------------------
LEDGER_NOT_FINITE = ("{mechanism}: the worst-case epsilon of this privatization is not finite "
                     "({epsilon}); the ledger cannot count it")

# -- the device ledger's filter (edge_agent.budget.ledger; the web edge's ledger) ---------------
# spent, needs, cap: worst-case ε as the ledger writes them; tool: the command that sets caps
BUDGET_NO_EPSILON = ("{family} has no differential-privacy epsilon, and this ledger has a cap: "
                     "it cannot admit it ({tool} --cap none removes the cap)")
BUDGET_CAP = ("privacy budget: spent {spent}, {what} needs {needs}, cap {cap} (worst-case "
              "epsilon; {tool})")
BUDGET_PER_DAY = ("privacy budget: spent {spent} in the last 24 hours, {what} needs {needs}, "
                  "per-day cap {cap} (worst-case epsilon; {tool})")

# -- bundles (shared.bundle) ----------------------------------------------------------------------
TABLE_ONLY = ("bundle {bundle_id12}… carries the privatization table {table} ({dim} "
              "dimensions), not the model's word embeddings: it serves dchi-text only "
              "(dchi-embedding needs a bundle with the model's table, e.g. cloud-api "
              "export-bundle --table none)")

BUNDLE_TABLE_NON_FINITE = "{where}/{file}: the table has non-finite values"
# a bundle's verification ({where}: the directory or tarball; {file}: one of its files)
BUNDLE_EITHER_TABLE = ("a bundle holds either the model's embeddings or a designed "
                       "privatization table, exactly one of them")
BUNDLE_MISSING = "{where}/{file}: missing"
BUNDLE_NOT_OBJECT = "{where}/{file}: not a JSON object"
BUNDLE_NOT_FORMAT = "{where}/{file}: not a {format} v{version} file"
BUNDLE_LACKS = "{where}/{file}: lacks its files, vocab_size or dim"
BUNDLE_HASH = ("{where}/{file}: content does not match its hash in {meta} (corrupted or "
               "modified); fetch the bundle again")
BUNDLE_UNLISTED = "{where}/{file}: does not list {required}"
BUNDLE_ID_MISMATCH = "{where}/{file}: bundle_id does not match the contents"
BUNDLE_NOT_EXPECTED = "{where}: bundle_id {bundle_id} is not the expected {expected}"
BUNDLE_NOT_REPRODUCED = "{where}: contents do not reproduce bundle_id {bundle_id}"
BUNDLE_TABLE_BLOCK = "{where}/{file}: its table block is not an object"
BUNDLE_TABLE_KIND = ("{where}/{file}: the table's dtype {dtype} or dim {dim} is not one this "
                     "edge reads (float32 or int8, dim >= 1)")  # dtype, dim: Python's repr
BUNDLE_TABLE_FILE = "{where}/{file}: the table must be stored in {table_file}"
BUNDLE_TABLE_SCALE = "{where}/{file}: an int8 table needs its {scale_file}"

# -- token policies (shared.policy; the web edge's bundle/policy.ts) --------------------------
# {where}: the file that holds the block (bundle.json); {name}: the policy's name; {example},
# {token}: Python's repr of a token (the web edge writes it as repr does)
POLICY_NOT_OBJECT = "{where}: the policy block must be an object"
POLICY_FIELDS = "{where}: the policy block needs a name, tokens and sha256"
POLICY_ORDER = ("{where}: the policy's tokens must be sorted, distinct and as many as its size "
                "says")
POLICY_DIGEST = "{where}: the policy's tokens do not match its sha256"
POLICY_NOT_PUBLIC = ("{where}: token policy {name} lists {count} word(s) that are not public "
                     "(e.g. {example}): a public list may hold only function words and "
                     "punctuation (shared.policy.REFERENCE); this bundle is refused")
POLICY_NOT_REGULAR = ("{where}: token policy {name} lists {token}, which is not a regular "
                      "token of the bundle's tokenizer")
# public_p asked of a bundle without a policy ({why}: POLICY_NONE_IN_BUNDLE or POLICY_NO_BUNDLE)
POLICY_NEEDED = ("{mechanism} with public_p needs a bundle with a token policy (a list of "
                 "public words); {why}")
POLICY_NONE_IN_BUNDLE = "bundle {bundle_id12}… has none"
POLICY_P_RANGE = "public_p must be in [0, 1], got {public_p}"  # public_p: Python's repr
POLICY_NO_BUNDLE = "no bundle was given"

# -- bundle pins (edge_agent.service.pins; the web edge's pins) -----------------------------
PIN_RENAMED = ("{server} no longer serves model {gone}, which this device pinned to bundle "
               "{pinned12}…, and now serves {model_id} with bundle {bundle_id12}…; a renamed "
               "model never gets a new bundle silently (accept it with --accept-bundle "
               "{bundle_id})")
PIN_CHANGED = ("model {model_id} at {server} now names bundle {bundle_id12}…, not the bundle "
               "{pinned12}… this device accepted for it first; a bundle decides what "
               "privatization means, so it never changes silently (accept it with "
               "--accept-bundle {bundle_id})")


# -- the bundles this edge vouches for, and the text floor (shared.trust, shared.floor_text) --
BUNDLE_KNOWN = "bundle {bundle_id12}… known: {name}, built by privbert from public sources"
BUNDLE_TRUSTED = "bundle {bundle_id12}… trusted by this app ({how})"
BUNDLE_UNVERIFIED = "bundle {bundle_id12}… unverified: checked by the floor only"
UNVERIFIED_REFUSED = ("bundle {bundle_id12}… is unverified (not one privbert builds from "
                      "public sources, nor one this app trusts) and {flag} refuses it; "
                      "trust it with {trust} {bundle_id} once you have checked it")
TEXT_FLOOR_HEAD = ("bundle {bundle_id12}… is unverified and weaker than the text floor at "
                   "eta={eta:g}")
TEXT_FLOOR_PIECES = ("{head}: its tokenizer cuts the public sample into {ppw:.3g} pieces per "
                     "word, {ratio:.3g} x the public model's {public:.3g} (limit {limit:g} x)"
                     "{tail}")
TEXT_FLOOR_UNREAD = ("{head}: its tokenizer reads {tokens:,} of the public sample's {pieces:,} "
                     "pieces as words ({least:,} are needed to measure it){tail}")
TEXT_FLOOR_DECODED = ("{head}: a context-free decoder recovers {decoded} of {draws:,} tokens "
                      "of public text privatized with it ({unchanged} sent unchanged; line "
                      "{line}){tail}")
TEXT_FLOOR_TAIL = "; use a bundle privbert knows, or trust this one with {trust} once checked"

def pct(p: float) -> str:
    """A share as the refusals write it: "100%" at 1, else two decimals ("97.31%")."""
    return "100%" if p >= 1.0 else f"{100 * p:.2f}%"


def weak_head(what: str) -> str:
    return WEAK_HEAD.format(what=what)


def templates() -> dict[str, str]:
    """Every template of this module by name (what the spec carries)."""
    return {k: v for k, v in globals().items() if k.isupper() and isinstance(v, str)}
