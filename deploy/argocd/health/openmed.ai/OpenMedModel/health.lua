-- Argo CD health of an openmed.ai/OpenMedModel, from the status the
-- operator writes (Argo CD runs this with gopher-lua, Lua 5.1).
--
-- Healthy:     Ready=True and the operator has seen the current generation
--              (and, with rolloutStrategy.soakSeconds, the soak is over).
-- Progressing: a rollout or rollback is under way, a Ready version still
--              soaks, or the operator waits for something that heals by
--              itself (target not there yet).
-- Degraded:    the rollout failed (RolledBack, Failed), or the resource
--              cannot be acted on (TargetConflict, InvalidSpec, a rejected
--              manual rollback).
-- Suspended:   the target Deployment is paused, or a canary waits for a
--              promote (a step without a pause, openmed.ai/canary-pause).
--
-- A canary is Progressing while it warms, holds a timed pause or measures
-- (never Suspended for a timed pause), and Degraded when its route or
-- canary Deployment needs fixing (RouteDrift, RouteInvalid,
-- CanaryTargetInvalid). An aborted canary is RolledBack: Degraded.
local hs = {}

local function condition(kind)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local status = obj.status or {}
local desired = status.desiredVersion or (obj.spec and obj.spec.version) or "?"
local active = status.activeVersion or "none"
local versions = "desired " .. desired .. ", active " .. active

local generation = obj.metadata and obj.metadata.generation
if obj.status == nil or status.observedGeneration == nil
    or (generation ~= nil and status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to act on this generation (" .. versions .. ")"
  return hs
end

local ready = condition("Ready")
local reason = ready and ready.reason or ""
local detail = ready and ready.message or ""
local with_detail = versions
if detail ~= "" then
  with_detail = versions .. ": " .. detail
end

local degraded_reasons = {
  TargetConflict = true,
  InvalidSpec = true,
  RollbackTargetUnavailable = true,
  RollbackFailed = true,
}
if degraded_reasons[reason] then
  hs.status = "Degraded"
  hs.message = reason .. " (" .. with_detail .. ")"
  return hs
end

if reason == "DeploymentPaused" then
  hs.status = "Suspended"
  hs.message = "Target Deployment paused (" .. versions .. ")"
  return hs
end

if status.phase == "Canary" then
  local canary = status.canary or {}
  local where = "canary of " .. desired
  if canary.step ~= nil and canary.step > 0 then
    where = where .. " at step " .. canary.step .. ", " .. (canary.weight or 0) .. "%"
  end
  local text = where .. " (active " .. active .. ")"
  if detail ~= "" then
    text = text .. ": " .. detail
  end
  if reason == "CanaryPaused" then
    hs.status = "Suspended"
  elseif reason == "RouteDrift" or reason == "RouteInvalid" or reason == "CanaryTargetInvalid" then
    hs.status = "Degraded"
  else
    hs.status = "Progressing"
  end
  hs.message = reason .. " (" .. text .. ")"
  return hs
end

local rolled_back = condition("RolledBack")
if status.phase == "RolledBack" and rolled_back ~= nil and rolled_back.status == "Unknown" then
  hs.status = "Progressing"
  hs.message = "Rolling back (" .. with_detail .. ")"
  return hs
end

if status.phase == "RolledBack" or status.phase == "Failed" then
  hs.status = "Degraded"
  hs.message = status.phase .. " (" .. with_detail .. ")"
  return hs
end

-- A version that is Ready and still soaking (rolloutStrategy.soakSeconds)
-- is Progressing until the soak is over: a sync wave or a progressive
-- sync step after it waits for the soak, as Flux's waves do
-- (docs/fleet.md).
local soaked = condition("Soaked")
if ready ~= nil and ready.status == "True" and soaked ~= nil and soaked.status == "False"
    and soaked.reason == "Soaking" then
  hs.status = "Progressing"
  hs.message = "Soaking (" .. versions .. ": " .. (soaked.message or "") .. ")"
  return hs
end

if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = "Ready (" .. versions .. ")"
  return hs
end

hs.status = "Progressing"
if reason ~= "" then
  hs.message = reason .. " (" .. with_detail .. ")"
else
  hs.message = "Rolling out (" .. versions .. ")"
end
return hs
