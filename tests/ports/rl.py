"""Reinforcement-learning ports (issue 28): policy gradients over a stored rollout, a PPO update over minibatches of
a rollout buffer, and a DQN over a replay buffer with a target network kept on ``ctx``.

The environment is generated in-process: a corridor MDP in torch, deterministic given its seed. Each port collects
its rollouts or transitions when its Setup is built (with the freshly initialised policy, as the first iteration of
its upstream does), and the batches handed to tropt are that rollout or minibatches drawn from that buffer.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from torch.distributions import Categorical
from torch.nn import functional as F

import tropt
from ports import Bug, Port

# ------------------------------------------------------------------ the environment: a corridor MDP
CELLS, ACTIONS, HORIZON, GAMMA = 6, 2, 10, 0.9


class Corridor:
    """``n`` parallel corridors of ``CELLS`` cells: action 1 moves right, 0 left; reaching the right end pays 1 and
    ends the episode, every other move costs 0.05; an episode also ends after ``HORIZON`` moves. Observations are
    one-hot cells. Start cells and resets are drawn from the environment's own seeded generator."""

    def __init__(self, n: int = 1, seed: int = 0) -> None:
        self.n, self.g = n, torch.Generator().manual_seed(seed)
        self.pos, self.t = self._starts(n), torch.zeros(n, dtype=torch.long)

    def _starts(self, k: int) -> torch.Tensor:
        return torch.randint(0, CELLS - 1, (k,), generator=self.g)

    def obs(self) -> torch.Tensor:
        return F.one_hot(self.pos, CELLS).float()

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Moves every corridor; returns (next observation, reward, done) and resets the finished ones."""
        self.pos = (self.pos + 2 * action - 1).clamp(0, CELLS - 1)
        self.t += 1
        goal = self.pos == CELLS - 1
        reward = torch.where(goal, 1.0, -0.05)
        done = goal | (self.t >= HORIZON)
        next_obs = self.obs()
        if done.any():
            self.pos[done], self.t[done] = self._starts(int(done.sum())), 0
        return next_obs, reward, done.float()


def _act(policy: nn.Module, obs: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples actions from the policy's logits with a seeded generator; returns (actions, their log-probs)."""
    with torch.no_grad():
        probs = F.softmax(policy(obs), -1)
    action = torch.multinomial(probs, 1, generator=g).flatten()
    return action, probs.gather(1, action[:, None]).flatten().log()


# ------------------------------------------------------------------ REINFORCE: returns of a stored rollout
class Policy(nn.Module):
    """The examples' policy: affine -> dropout(0.6) -> ReLU -> action scores."""

    def __init__(self) -> None:
        super().__init__()
        self.affine1 = nn.Linear(CELLS, 64)
        self.dropout = nn.Dropout(p=0.6)
        self.affine2 = nn.Linear(64, ACTIONS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.affine2(F.relu(self.dropout(self.affine1(x))))


def reinforce_rollouts(policy: nn.Module, batches: int = 3, min_steps: int = 16, seed: int = 0) -> list:
    """Batches of whole episodes, at least ``min_steps`` steps each: (observations, actions, returns). Each
    episode's discounted returns are computed backwards from its rewards and standardised over the episode
    (``finish_episode``)."""
    env, g = Corridor(1, seed), torch.Generator().manual_seed(seed + 1)
    out: list[tuple] = []
    pending: list[tuple] = []
    while len(out) < batches:
        obs, acts, rewards, done = [], [], [], False
        while not done:  # actions sampled with dropout on, as the examples' select_action does
            o = env.obs()
            a, _ = _act(policy, o, g)
            _, r, d = env.step(a)
            obs.append(o[0])
            acts.append(a[0])
            rewards.append(float(r))
            done = bool(d)
        returns: list[float] = []
        run = 0.0
        for reward in reversed(rewards):
            run = reward + GAMMA * run
            returns.insert(0, run)
        ret = torch.tensor(returns)
        ret = (ret - ret.mean()) / (ret.std(unbiased=False) + 1e-6)
        pending.append((torch.stack(obs), torch.stack(acts), ret))
        if sum(len(p[0]) for p in pending) >= min_steps:
            out.append(tuple(torch.cat(parts) for parts in zip(*pending)))
            pending = []
    return out


def reinforce_loss(model: nn.Module, batch) -> torch.Tensor:
    """The policy loss summed over the rollout's steps: sum of -log pi(a|s) * R."""
    obs, acts, ret = batch
    logp = F.log_softmax(model(obs), -1).gather(1, acts[:, None]).flatten()
    return (-logp * ret).sum()


def reinforce_setup(*, eval_left_on: bool = False) -> tropt.Setup:
    """pytorch/examples ``reinforcement_learning/reinforce.py``: the dropout policy, ``Adam(lr=1e-2)``, an episode
    rolled out with actions sampled from the policy, and ``finish_episode``: discounted returns standardised,
    ``policy_loss = sum(-log_prob * R)``, ``zero_grad``, ``backward``, ``step``. The stored episode is the batch.

    ``eval_left_on`` plants the rollout's ``policy.eval()`` (acting without dropout) never switched back before the
    update."""

    def step(ctx, micro_batches):
        if eval_left_on:  # BUG: the acting phase's eval() stays on for the update
            ctx.model.eval()
        ctx.optimizer.zero_grad()
        loss = torch.zeros(())
        for mb in micro_batches:  # a sum over steps: micro-batch sums add up to the episode's sum
            part = ctx.loss_fn(ctx.model, mb)
            part.backward()
            loss += part.detach()
        ctx.optimizer.step()
        return loss

    torch.manual_seed(0)
    policy = Policy()
    return tropt.Setup(policy, reinforce_loss, lambda m: torch.optim.Adam(m.parameters(), lr=1e-2),
                       reinforce_rollouts(copy.deepcopy(policy)), step=step)



# ------------------------------------------------------------------ actor-critic: a shared body, value baseline
class ActorCritic(nn.Module):
    """The examples' actor-critic: a shared affine layer, an action head (logits) and a value head."""

    def __init__(self) -> None:
        super().__init__()
        self.affine1 = nn.Linear(CELLS, 64)
        self.action_head = nn.Linear(64, ACTIONS)
        self.value_head = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = F.relu(self.affine1(x))
        return self.action_head(h), self.value_head(h).flatten()


class _Actor(nn.Module):
    """The actor-critic's action scores, for collecting a rollout with ``_act``."""

    def __init__(self, net: ActorCritic) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)[0]


def actor_critic_loss(model: nn.Module, batch, detach_baseline: bool = True) -> torch.Tensor:
    """Sum over the rollout of -log pi(a|s) * (R - V(s)) plus the smooth-L1 value loss; the advantage uses the value
    as a number (``value.item()``), so the policy term never trains the critic."""
    obs, acts, ret = batch
    logits, value = model(obs)
    logp = F.log_softmax(logits, -1).gather(1, acts[:, None]).flatten()
    baseline = value.detach() if detach_baseline else value  # BUG when not detached: the policy loss moves V
    return (-logp * (ret - baseline)).sum() + F.smooth_l1_loss(value, ret, reduction="sum")


def actor_critic_setup(*, detach_baseline: bool = True) -> tropt.Setup:
    """pytorch/examples ``reinforcement_learning/actor_critic.py``: a shared layer with action and value heads,
    ``Adam(lr=3e-2)`` (1e-2 here), an episode rolled out from the policy, and ``finish_episode``: standardised
    returns, ``advantage = R - value.item()``, the summed policy losses plus the summed ``smooth_l1_loss`` of the
    values, ``zero_grad``, ``backward``, ``step``. ``detach_baseline=False`` plants the advantage kept as a tensor."""

    def loss_fn(model, batch):
        return actor_critic_loss(model, batch, detach_baseline)

    torch.manual_seed(0)
    net = ActorCritic()
    return tropt.Setup(net, loss_fn, lambda m: torch.optim.Adam(m.parameters(), lr=1e-2),
                       reinforce_rollouts(_Actor(copy.deepcopy(net))))


# ------------------------------------------------------------------ PPO: clipped surrogate over a rollout buffer
ENVS, STEPS, MINIBATCHES, EPOCHS, CLIP, ITERATIONS = 4, 16, 4, 4, 0.2, 10


def layer_init(layer: nn.Linear, std: float = 2 ** 0.5) -> nn.Linear:
    """cleanrl's ``layer_init``: orthogonal weights of gain ``std``, zero bias."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.zeros_(layer.bias)
    return layer


class Agent(nn.Module):
    """Separate actor and critic MLPs (tanh), orthogonally initialised; the actor's last layer at gain 0.01."""

    def __init__(self) -> None:
        super().__init__()
        self.critic = nn.Sequential(layer_init(nn.Linear(CELLS, 32)), nn.Tanh(), layer_init(nn.Linear(32, 32)),
                                    nn.Tanh(), layer_init(nn.Linear(32, 1), 1.0))
        self.actor = nn.Sequential(layer_init(nn.Linear(CELLS, 32)), nn.Tanh(), layer_init(nn.Linear(32, 32)),
                                   nn.Tanh(), layer_init(nn.Linear(32, ACTIONS), 0.01))

    def forward(self, x: torch.Tensor, action: torch.Tensor | None = None) -> Any:
        """The action logits; with ``action``, cleanrl's ``get_action_and_value`` (through ``forward``, so that
        a DistributedDataParallel wrapper sees the call)."""
        if action is None:
            return self.actor(x)
        dist = Categorical(logits=self.actor(x))
        return action, dist.log_prob(action), dist.entropy(), self.critic(x)

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)


def ppo_minibatches(agent: Agent, seed: int = 0) -> list:
    """One iteration's rollout of ``ENVS`` x ``STEPS`` transitions with the initial agent, advantages by GAE
    (lambda 0.95) bootstrapped from the last value, flattened into a buffer and cut into ``MINIBATCHES`` shuffled
    minibatches per epoch for ``EPOCHS`` epochs: (obs, actions, logprobs, advantages, returns, values)."""
    env, g = Corridor(ENVS, seed), torch.Generator().manual_seed(seed + 1)
    obs: list[torch.Tensor] = []
    acts: list[torch.Tensor] = []
    logps: list[torch.Tensor] = []
    rewards: list[torch.Tensor] = []
    dones: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    for _ in range(STEPS):
        o = env.obs()
        a, lp = _act(agent, o, g)
        with torch.no_grad():
            values.append(agent.get_value(o).flatten())
        _, r, d = env.step(a)
        obs.append(o)
        acts.append(a)
        logps.append(lp)
        rewards.append(r)
        dones.append(d)
    with torch.no_grad():
        next_value = agent.get_value(env.obs()).flatten()
    adv, last = torch.zeros(STEPS, ENVS), torch.zeros(ENVS)
    for t in reversed(range(STEPS)):
        nv = next_value if t == STEPS - 1 else values[t + 1]
        delta = rewards[t] + GAMMA * nv * (1 - dones[t]) - values[t]
        last = delta + GAMMA * 0.95 * (1 - dones[t]) * last
        adv[t] = last
    val = torch.stack(values)
    buffer = (torch.cat(obs), torch.cat(acts), torch.cat(logps), adv.flatten(), (adv + val).flatten(),
              val.flatten())
    size = STEPS * ENVS // MINIBATCHES
    out = []
    for _ in range(EPOCHS):
        idx = torch.randperm(STEPS * ENVS, generator=g)
        out += [tuple(t[idx[s:s + size]] for t in buffer) for s in range(0, STEPS * ENVS, size)]
    return out


def ppo_loss(model: nn.Module, batch, adv_stats: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Clipped surrogate + 0.5 x clipped value loss - 0.01 x entropy, the advantages standardised over the
    minibatch (or with the given mean and std, when the minibatch arrives in parts)."""
    obs, acts, old_logp, adv, returns, old_values = batch
    _, logp, entropy, value = model(obs, acts)
    ratio = (logp - old_logp).exp()
    mean, std = adv_stats if adv_stats is not None else (adv.mean(), adv.std())
    adv = (adv - mean) / (std + 1e-8)
    pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - CLIP, 1 + CLIP)).mean()
    value = value.flatten()
    clipped = old_values + (value - old_values).clamp(-CLIP, CLIP)
    v_loss = 0.5 * torch.max((value - returns) ** 2, (clipped - returns) ** 2).mean()
    return pg_loss - 0.01 * entropy.mean() + 0.5 * v_loss


def ppo_setup(*, forget_zero_grad: bool = False) -> tropt.Setup:
    """vwxyzjn/cleanrl ``cleanrl/ppo.py``: an ``Agent`` with separate actor and critic, a rollout of
    ``num_envs`` x ``num_steps`` with GAE, then ``update_epochs`` epochs of shuffled minibatches: the clipped
    surrogate with per-minibatch advantage normalisation, the clipped value loss, an entropy bonus,
    ``optimizer.zero_grad()``, ``backward()``, ``clip_grad_norm_(max_grad_norm=0.5)``, ``optimizer.step()``;
    ``Adam(lr=2.5e-4, eps=1e-5)`` (3e-3 here) with the learning rate annealed linearly by hand once per iteration.
    One call is one minibatch update; a minibatch arriving as micro-batches is normalised over all of them."""

    def step(ctx, micro_batches):
        ctx.update = getattr(ctx, "update", 0)
        if ctx.update % (EPOCHS * MINIBATCHES) == 0:  # anneal_lr, at the start of each iteration
            frac = 1.0 - (ctx.update // (EPOCHS * MINIBATCHES)) / ITERATIONS
            for group in ctx.optimizer.param_groups:
                group["lr"] = frac * 3e-3
        adv = torch.cat([mb[3] for mb in micro_batches])
        stats, n = (adv.mean(), adv.std()), len(adv)
        if not forget_zero_grad:  # BUG when missing: each update adds the previous minibatches' gradients
            ctx.optimizer.zero_grad()
        total = torch.zeros(())
        for mb in micro_batches:
            loss = ppo_loss(ctx.model, mb, stats) * (len(mb[0]) / n)
            loss.backward()
            total += loss.detach()
        nn.utils.clip_grad_norm_(ctx.model.parameters(), 0.5)
        ctx.optimizer.step()
        ctx.update += 1
        return total

    torch.manual_seed(0)
    agent = Agent()
    return tropt.Setup(agent, ppo_loss, lambda m: torch.optim.Adam(m.parameters(), lr=3e-3, eps=1e-5),
                       ppo_minibatches(copy.deepcopy(agent)), step=step)


# ------------------------------------------------------------------ DQN: replay buffer, target network on ctx
TAU, BATCH_DQN = 0.005, 32


def qnet() -> nn.Sequential:
    return nn.Sequential(nn.Linear(CELLS, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, ACTIONS))


def replay_minibatches(n_batches: int = 6, transitions: int = 200, seed: int = 0) -> list:
    """A replay memory filled by the epsilon-greedy policy at its start (epsilon 1: uniform actions), then
    minibatches sampled from it uniformly: (state, action, reward, next_state, done)."""
    env, g = Corridor(1, seed), torch.Generator().manual_seed(seed + 1)
    memory = []
    for _ in range(transitions):
        s = env.obs()[0]
        a = torch.randint(0, ACTIONS, (1,), generator=g)
        s2, r, d = env.step(a)
        memory.append((s, a[0], r[0], s2[0], d[0]))
    out = []
    for _ in range(n_batches):
        idx = torch.randint(0, transitions, (BATCH_DQN,), generator=g).tolist()
        out.append(tuple(torch.stack([memory[i][c] for i in idx]) for c in range(5)))
    return out


def td_loss(model: nn.Module, batch, target: nn.Module | None = None) -> torch.Tensor:
    """Huber loss between Q(s, a) and r + gamma * max_a' Q_target(s', a') (zero past a terminal state); the target
    network defaults to the model itself, without gradient."""
    s, a, r, s2, done = batch
    q = model(s).gather(1, a[:, None]).flatten()
    with torch.no_grad():
        next_q = (target if target is not None else model)(s2).max(1).values * (1 - done)
    return F.smooth_l1_loss(q, r + GAMMA * next_q)


def dqn_setup(*, checkpoint_target: bool = True) -> tropt.Setup:
    """pytorch/tutorials ``intermediate_source/reinforcement_q_learning.py``: a policy and a target network
    (``target_net.load_state_dict(policy_net.state_dict())``, kept here on ``ctx.target_net``), a replay memory
    sampled in minibatches, ``SmoothL1Loss`` on the TD target computed under ``no_grad`` by the target network,
    ``AdamW(lr=1e-4, amsgrad=True)`` (1e-3 here), ``clip_grad_value_(100)``, and a soft update of the target,
    ``theta' <- tau theta + (1 - tau) theta'``, after every optimisation step. The Setup's ``loss_fn`` is the same
    TD loss with the model as its own target.

    ``checkpoint_target=False`` plants a checkpoint of the policy network and optimizer only (as cleanrl's
    ``dqn.py`` saves ``q_network.state_dict()``): on resume the target network restarts as a copy of the policy."""

    def step(ctx, micro_batches):
        net = ctx.model.module if hasattr(ctx.model, "module") else ctx.model
        if not hasattr(ctx, "target_net"):
            ctx.target_net = copy.deepcopy(net).requires_grad_(False)
        n = sum(len(mb[0]) for mb in micro_batches)
        ctx.optimizer.zero_grad()
        total = torch.zeros(())
        for mb in micro_batches:
            loss = td_loss(ctx.model, mb, ctx.target_net) * (len(mb[0]) / n)
            loss.backward()
            total += loss.detach()
        nn.utils.clip_grad_value_(ctx.model.parameters(), 100)
        ctx.optimizer.step()
        with torch.no_grad():
            for p_t, p in zip(ctx.target_net.parameters(), net.parameters()):
                p_t.mul_(1 - TAU).add_(p, alpha=TAU)
        return total

    def save_state(ctx):
        return {"q_network": copy.deepcopy(ctx.model.state_dict()), "optimizer": copy.deepcopy(
            ctx.optimizer.state_dict())}

    def load_state(ctx, state):
        ctx.model.load_state_dict(state["q_network"])
        ctx.optimizer.load_state_dict(state["optimizer"])

    torch.manual_seed(0)
    return tropt.Setup(qnet(), td_loss, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, amsgrad=True),
                       replay_minibatches(), step=step, save_state=None if checkpoint_target else save_state,
                       load_state=None if checkpoint_target else load_state)


PORTS = [
    Port("reinforce_stored_episode", "rl", "pytorch/examples/reinforcement_learning/reinforce.py", reinforce_setup,
         bugs=(Bug("reinforce_eval_left_on", "loop.train_mode", ("model.eval() inside the step",),
                   lambda: reinforce_setup(eval_left_on=True),
                   source="a rollout collected under policy.eval() without policy.train() before the update"),)),
    Port("actor_critic_value_baseline", "rl", "pytorch/examples/reinforcement_learning/actor_critic.py",
         actor_critic_setup,
         notes={"loop.accumulation": "latent: tropt.standard_step weights each micro-batch loss as a mean, and this "
                                     "loss is a sum over the rollout (the examples do not accumulate)"}),
    Port("cleanrl_ppo_rollout_buffer", "rl", "vwxyzjn/cleanrl/cleanrl/ppo.py", ppo_setup,
         bugs=(Bug("ppo_forgotten_zero_grad", "loop.zero_grad", ("plus the gradient left over from step 1",),
                   lambda: ppo_setup(forget_zero_grad=True),
                   source="PyTorch docs, 'Zeroing out gradients': gradients accumulate unless zeroed every step"),)),
    Port("dqn_replay_target_network", "rl", "pytorch/tutorials/intermediate_source/reinforcement_q_learning.py",
         dqn_setup,
         notes={"model.overfit_batch": "the Setup's TD loss bootstraps from the model itself: its target moves as "
                                       "the model learns, so one batch is not memorised in 100 steps"},
         bugs=(Bug("dqn_target_network_not_checkpointed", "loop.resume", ("target_net",),
                   lambda: dqn_setup(checkpoint_target=False),
                   source="cleanrl dqn.py saves q_network.state_dict() only; the target network is not restored"),)),
]

# Documented bugs no check catches yet: move each into its port's ``bugs`` once a check names the cause.
PENDING = [
    ("actor_critic_value_baseline",
     Bug("actor_critic_advantage_not_detached", "model.gradient_flow", ("advantage",),
         lambda: actor_critic_setup(detach_baseline=False),
         source="pytorch/examples actor_critic.py uses value.item() in the advantage; with the tensor, the policy "
                "gradient trains the critic (Sutton & Barto, 13.5: the baseline is not differentiated)")),
]
