"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms",
arXiv:2302.06675, Algorithm 2 with decoupled weight decay) as a
torch.optim.Optimizer, written from the paper with PyTorch's tensor ops: the
reference headroom's Lion trains against (PyTorch has no Lion).

    c <- b1 m + (1 - b1) g
    p <- p (1 - lr wd) - lr sign(c)
    m <- b2 m + (1 - b2) g          (m starts at zero)
"""
import torch


class Lion(torch.optim.Optimizer):
    def __init__(self, params, lr, betas, weight_decay):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, (b1, b2), wd = group["lr"], group["betas"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m, g = state["exp_avg"], p.grad
                c = m * b1 + g * (1 - b1)
                p.mul_(1 - lr * wd)
                p.add_(torch.sign(c), alpha=-lr)
                m.mul_(b2).add_(g, alpha=1 - b2)
