// A stand-in for ComfyUI's `api` (scripts/api.js): fetchApi prefixes "/api" as the frontend does, and the
// request reaches the real server under test.
export const api = {
    fetchApi(route, options) { return fetch(`/api${route}`, options); },
};
