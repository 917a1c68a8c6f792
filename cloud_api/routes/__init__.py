"""HTTP routes: short functions that call ``app.state.registry`` / ``bundles`` / the store.

Each module exposes ``router = APIRouter(...)``; ``cloud_api.app.ROUTERS`` lists them."""
