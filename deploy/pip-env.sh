# Sourced by the Dockerfile's pip steps: pip's settings for this build, from the build
# arguments and the build secret `pip_ca` (never written into a layer).
for var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS PIP_TRUSTED_HOST TORCH_INDEX; do
    eval "[ -n \"\${$var:-}\" ] || unset $var"   # an empty build argument: pip's default
done
if [ -s /run/secrets/pip_ca ]; then
    export PIP_CERT=/run/secrets/pip_ca
fi
if [ -n "${TORCH_INDEX:-}" ]; then
    export PIP_EXTRA_INDEX_URL="${PIP_EXTRA_INDEX_URL:+$PIP_EXTRA_INDEX_URL }$TORCH_INDEX"
fi
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
    PIP_NO_INPUT=1 PIP_CONSTRAINT=/tmp/build/constraints.txt
