"""HTTP routes: short functions that call ``app.state.served_models`` / ``bundles`` / the store.

Each module exposes ``router = APIRouter(...)``; ``cloud_api.app.ROUTERS`` lists them."""
