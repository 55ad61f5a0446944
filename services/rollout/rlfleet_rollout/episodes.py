"""Playing a group: G multi-turn episodes against an env service, one trajectory each.

Per turn, every live episode's context goes to the engine in one batch (merged with the
other groups' by the batcher); the decoded texts go to the env in one Step; each new
observation is appended as a delta. Finished episodes are scored by the reward service
and streamed back at once, with everything the learner needs.
"""

from __future__ import annotations

import hashlib
import io
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from PIL import Image

from rlfleet import limits
from rlfleet.clients.env import EnvClient
from rlfleet.clients.reward import RewardClient
from rlfleet.engines.base import Generation, GenerationRequest, SamplingConfig
from rlfleet.names import from_wire, to_wire
from rlfleet.policy.chat import ChatCodec, Encoded
from rlfleet.policy.contexts import (
    CONTEXT_ACTION_FORMATS,
    CONTEXT_CELL_PX,
    is_full_history,
    observation_message,
    turn_text,
)
from rlfleet.policy.observation import ForeignProfileError, ProfileMarks, check_observation_profile
from rlfleet.rpc.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RpcError,
    Unavailable,
)
from rlfleet.v1 import (
    common_pb2,
    env_pb2,
    reward_pb2,
    rollout_pb2,
)
from rlfleet_rollout.batcher import GenerationBatcher
from rlfleet_rollout.closer import EpisodeCloser
from rlfleet_rollout.loaded_adapters import LiveAdapter


def sampling_config(params: rollout_pb2.SamplingParams, engine: str = "") -> SamplingConfig:
    """Proto sampling params to the engine's, checked against what `engine` serves (''
    : what every engine serves): INVALID_ARGUMENT naming the setting and the bound."""
    try:
        limits.check_sampling(engine, params.temperature, params.top_p, params.top_k)
    except limits.UnservableSampling as exc:
        raise InvalidArgument(f"sampling: {exc}") from None
    if not 0 <= params.max_new_tokens <= limits.MAX_NEW_TOKENS:
        raise InvalidArgument(f"max_new_tokens must be in 1..{limits.MAX_NEW_TOKENS}")
    return SamplingConfig(
        temperature=params.temperature,
        top_p=params.top_p or 1.0,
        top_k=params.top_k,
        max_new_tokens=params.max_new_tokens or 16,
        seed=params.seed or None,
    )


@dataclass
class EpisodeBuffer:
    """One episode's token sequence, in any context mode (rlfleet.policy.contexts)."""

    codec: ChatCodec
    context: str
    instruction: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    images: list[Image.Image] = field(default_factory=list)
    pngs: list[bytes] = field(default_factory=list)
    segment_starts: list[int] = field(default_factory=list)
    turns: list[rollout_pb2.TurnSpan] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    _segment_images: int = 0  # images of the current segment (per-turn contexts)

    def _append(self, enc: Encoded, png: bytes) -> None:
        self.token_ids.extend(enc.token_ids)
        self.logprobs.extend([0.0] * len(enc.token_ids))
        self.loss_mask.extend([0] * len(enc.token_ids))
        self.images.extend(enc.images)
        if png:  # an observation of a text task has no frame
            self.pngs.append(png)

    def start(self, observation: common_pb2.Observation) -> None:
        self.segment_starts.append(0)
        # The first observation's text is the instruction, a blank line, the status.
        status = observation.text.removeprefix(self.instruction).lstrip("\n")
        text = observation.text if is_full_history(self.context) else \
            turn_text(self.context, self.instruction, status, observation.feedback)
        enc = self.codec.encode_prompt([observation_message(
            observation.image.png, text, observation.image.media_type)])
        self._append(enc, observation.image.png)
        self._segment_images = len(enc.images)

    def request(self) -> GenerationRequest:
        start = self.segment_starts[-1]
        images = self.images if is_full_history(self.context) else \
            self.images[len(self.images) - self._segment_images:]
        # each image was bounded when it was decoded; the prompt's images together too
        frames = self.pngs[len(self.pngs) - len(images):] if images else []
        self.codec.image_bounds.check_prompt(
            len(images), sum(len(png) for png in frames),
            sum(image.width * image.height for image in images))
        return GenerationRequest(prompt_ids=self.token_ids[start:], images=list(images))

    def add_turn(self, gen: Generation, text: str) -> None:
        start = len(self.token_ids)
        self.token_ids.extend(gen.token_ids)
        self.logprobs.extend(gen.logprobs)
        self.loss_mask.extend([1] * len(gen.token_ids))
        self.turns.append(rollout_pb2.TurnSpan(start=start, end=len(self.token_ids), text=text))
        self.actions.append(text)

    def add_observation(self, observation: common_pb2.Observation) -> None:
        png, media_type = observation.image.png, observation.image.media_type
        if is_full_history(self.context):
            last = self.turns[-1]
            enc = self.codec.encode_observation(
                observation_message(png, observation.text, media_type),
                self.token_ids[last.start:last.end])
            self._append(enc, png)
            return
        # per-turn contexts: a fresh sequence with the current frame only
        self.segment_starts.append(len(self.token_ids))
        text = turn_text(self.context, self.instruction, observation.text,
                         observation.feedback)
        enc = self.codec.encode_prompt([observation_message(png, text, media_type)])
        self._append(enc, png)
        self._segment_images = len(enc.images)

    @property
    def length(self) -> int:
        return len(self.token_ids)


@dataclass
class Episode:
    index: int
    episode_id: str
    buffer: EpisodeBuffer
    started: float
    generate_s: float = 0.0
    env_s: float = 0.0
    final_state: common_pb2.EpisodeState | None = None


def _open_error(err: RpcError) -> RpcError:
    """The replica's answer when the env refused to open the group's episodes: the
    caller's spec was at fault (NOT_FOUND, INVALID_ARGUMENT: the same answer from any
    replica), or the env failed (UNAVAILABLE: worth re-sending the group)."""
    if isinstance(err, NotFound | InvalidArgument):
        return type(err)(f"env service: {err.message}")
    return Unavailable(f"env service at {err.peer} failed: {err.code.name}: {err.message}")


def _score_error(err: RpcError) -> RpcError:
    """The replica's answer when the reward service did not score the group. A reward
    function that broke its contract (FAILED_PRECONDITION: it raised, or gave a NaN or a
    reward outside its range) or a request it refuses (INVALID_ARGUMENT, NOT_FOUND) gets
    the same answer from any replica: INVALID_ARGUMENT / NOT_FOUND with the reward
    service's message, which the pool does not re-send (FAILED_PRECONDITION would be: it
    also means "this replica has not loaded the adapter yet"). Anything else is the reward
    service failing now (UNAVAILABLE: worth re-sending the group)."""
    if isinstance(err, NotFound):
        return NotFound(f"reward service: {err.message}")
    if isinstance(err, FailedPrecondition | InvalidArgument):
        return InvalidArgument(f"reward service at {err.peer} refused to score the group: "
                               f"{err.code.name}: {err.message}")
    return Unavailable(f"reward service at {err.peer} failed: {err.code.name}: {err.message}")


@dataclass
class GroupPlayer:
    batcher: GenerationBatcher
    codec: ChatCodec
    env: EnvClient
    reward: RewardClient
    replica_id: str
    cell_px: int = 0
    # what the served checkpoint says about observation profiles (rlfleet.policy.observation)
    model_dir: str = ""
    profile_marks: ProfileMarks = field(default_factory=ProfileMarks)
    closer: EpisodeCloser | None = None  # default: one over `env`
    engine: str = ""  # the engine's name: the sampling settings it serves (rlfleet.limits)

    def __post_init__(self) -> None:
        if self.closer is None:
            self.closer = EpisodeCloser(self.env)

    def play(self, request: rollout_pb2.GroupRequest, adapter: LiveAdapter,
             is_active: Callable[[], bool], queued_s: float = 0.0
             ) -> Iterator[rollout_pb2.Trajectory]:
        params = sampling_config(request.sampling, self.engine)
        try:  # UNSPECIFIED is full; a value this build does not know is refused
            context = from_wire(common_pb2.Context, request.context_mode, default="full")
        except ValueError as exc:
            raise InvalidArgument(f"context_mode: {exc}") from None
        try:
            check_observation_profile(self.model_dir, context, self.profile_marks)
        except ForeignProfileError as exc:
            raise FailedPrecondition(str(exc)) from None
        spec = common_pb2.TaskSpec()
        spec.CopyFrom(request.task)
        required = CONTEXT_ACTION_FORMATS.get(context)
        if required is not None:
            # the env writes this profile's observations: its task plays in its format
            want = to_wire(common_pb2.ActionFormat, required)
            if spec.format not in (common_pb2.ACTION_FORMAT_UNSPECIFIED, want):
                raise InvalidArgument(
                    f"context_mode {context} plays the task in action format {required}, "
                    f"the request asks for {common_pb2.ActionFormat.Name(spec.format)}")
            spec.format = want
        if not spec.render.cell_px:
            spec.render.cell_px = CONTEXT_CELL_PX.get(context, self.cell_px)
        unseeded = SamplingConfig(**{**params.__dict__, "seed": None})
        G = request.group_size
        start = time.perf_counter()
        request_id = uuid.uuid4().hex
        try:
            opened = self.env.open([spec] * G, include_image=True, request_id=request_id)
        except RpcError as err:
            # the env may have opened them and lost only its answer: close them by name
            self.closer.close(request_ids=[request_id], now=False)
            raise _open_error(err) from err
        live: list[Episode] = []
        for i, e in enumerate(opened):
            buf = EpisodeBuffer(self.codec, context, instruction=e.observation.instruction)
            buf.start(e.observation)
            live.append(Episode(i, e.episode_id, buf, start))
        open_ids = {e.episode_id for e in live}
        try:
            turn = 0
            while live:
                if not is_active():
                    return
                # Each request carries its own seed (episode index and turn), so the
                # batcher can merge this group's turn with every other group's.
                requests = [ep.buffer.request() for ep in live]
                if params.seed is not None:
                    for ep, req in zip(live, requests, strict=True):
                        req.seed = params.seed + 1_000_003 * turn + ep.index
                t0 = time.perf_counter()
                gens = self.batcher.generate(requests, unseeded, adapter.engine_name)
                dt_gen = time.perf_counter() - t0
                actions = []
                for ep, gen in zip(live, gens, strict=True):
                    text = self.codec.decode(gen.token_ids)
                    if required is None:
                        sent = text[:limits.MAX_ACTION_TEXT_BYTES // 4]
                    elif len(text.encode()) > limits.MAX_ACTION_TEXT_BYTES:
                        # a harness's own profile sends the reply whole (a cut one would
                        # be quoted differently than VisGym quotes it), up to the env's
                        # bound: room for a verbalized reply of VisGym's 512 tokens
                        raise InvalidArgument(
                            f"a reply of {len(text.encode())} bytes is longer than the "
                            f"{limits.MAX_ACTION_TEXT_BYTES} a {context} turn may send "
                            f"(sampling.max_new_tokens={params.max_new_tokens})")
                    else:
                        sent = text
                    ep.buffer.add_turn(gen, text)
                    ep.generate_s += dt_gen
                    actions.append(env_pb2.Action(episode_id=ep.episode_id, text=sent))
                t0 = time.perf_counter()
                try:
                    results = self.env.step(actions, include_image=True)
                except RpcError as err:
                    # Mid-episode the spec was already accepted: a lost episode means the
                    # env restarted, so the group is worth retrying (UNAVAILABLE).
                    raise Unavailable(f"env service at {self.env.address} lost the "
                                      f"episodes: {err.code.name}: {err.message}") from err
                dt_env = time.perf_counter() - t0
                finished, still = [], []
                for ep, result in zip(live, results, strict=True):
                    ep.env_s += dt_env
                    span = ep.buffer.turns[-1]
                    span.feedback = result.observation.feedback
                    span.action = result.action
                    too_long = ep.buffer.length >= limits.MAX_TRAJECTORY_TOKENS - 4096
                    if result.observation.done or too_long:
                        ep.final_state = result.state
                        finished.append(ep)
                    else:
                        ep.buffer.add_observation(result.observation)
                        still.append(ep)
                live = still
                turn += 1
                if finished:
                    yield from self._finish(request, spec, finished, adapter, context, queued_s)
                    open_ids -= {ep.episode_id for ep in finished}
        finally:
            if open_ids:  # the group failed or was cancelled: its episodes go now
                self.closer.close(episode_ids=open_ids)

    def _finish(self, request: rollout_pb2.GroupRequest, spec: common_pb2.TaskSpec,
                episodes: list[Episode], adapter: LiveAdapter, context: str,
                queued_s: float) -> Iterator[rollout_pb2.Trajectory]:
        self.closer.close(episode_ids=[e.episode_id for e in episodes])
        t0 = time.perf_counter()
        try:
            scored = self.reward.score([
                reward_pb2.EpisodeRecord(task=spec, actions=e.buffer.actions,
                                         final_state=e.final_state)
                for e in episodes])
        except RpcError as err:
            raise _score_error(err) from err
        reward_s = time.perf_counter() - t0
        vision_start = self.codec.tokenizer.convert_tokens_to_ids("<|vision_start|>")
        for ep, score in zip(episodes, scored.scores, strict=True):
            buf = ep.buffer
            yield rollout_pb2.Trajectory(
                idempotency_key=request.idempotency_key,
                index=ep.index,
                token_ids=buf.token_ids,
                logprobs=buf.logprobs,
                loss_mask=buf.loss_mask,
                turns=buf.turns,
                images=[_image(png, request.include_images) for png in buf.pngs],
                reward=score.reward,
                reward_components=dict(score.components),
                solved=score.solved,
                adapter=common_pb2.AdapterRef(run=adapter.run, version=adapter.version,
                                              path=adapter.path, sha256=adapter.sha256),
                timings=rollout_pb2.Timings(
                    queue_s=queued_s, generate_s=ep.generate_s, env_s=ep.env_s,
                    reward_s=reward_s, total_s=time.perf_counter() - ep.started),
                final_state=ep.final_state,
                replica_id=self.replica_id,
                reward_name=scored.info.name,
                reward_version=scored.info.version,
                turn_rewards=score.turn_rewards,
                prompt_tokens=buf.turns[0].start if buf.turns else buf.length,
                image_token_offsets=[i for i, t in enumerate(buf.token_ids)
                                     if t == vision_start and not buf.loss_mask[i]],
                segment_starts=buf.segment_starts,
                context_mode=to_wire(common_pb2.Context, context),
            )


def _image(png: bytes, inline: bool) -> common_pb2.Image:
    with Image.open(io.BytesIO(png)) as img:
        width, height = img.size
    return common_pb2.Image(png=png if inline else b"", width=width, height=height,
                            sha256=hashlib.sha256(png).hexdigest())
