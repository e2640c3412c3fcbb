# sourced at the start of every device call: carried wheels, data dir, unbuffered output
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HWH_DATA_DIR=$PWD/.gpu_data
export JAX_COMPILATION_CACHE_DIR=/tmp/jax_cache
python3 -c "import jax, flax, optax, orbax.checkpoint, grain, ml_collections; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"
