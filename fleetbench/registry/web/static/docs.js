// The API's interactive docs: Swagger UI (the registry's own copy, from the
// fastapi-offline package: no CDN) drawing /openapi.json. Started from this file because
// the pages' policy allows no inline script.
import { done } from "./common.js";

window.SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  presets: [window.SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  // No badge from validator.swagger.io: it would send the schema's address elsewhere.
  validatorUrl: null,
  onComplete: () => done(),
});
